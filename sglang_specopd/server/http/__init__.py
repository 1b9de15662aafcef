"""The plugin routes' shared HTTP pieces: bounded body reading, the JSON error reply, the connection guard.

:mod:`.body` reads request bodies with bounds, :mod:`.errors` holds the payload limit and error replies,
:mod:`.guard` keeps uvicorn's keep-alive timer from closing a connection with unread bytes.
May import the wire protocol (and FastAPI/uvicorn lazily); no other plugin package, never ``sglang``.
"""
