"""Bounded reading of request bodies for the plugin's routes: size, time, and strict JSON.

Every route the plugin adds reads its body through :func:`read_body` (never ``await request.body()``), so a body
is bounded before any work starts:

* size: a declared ``Content-Length`` over the limit is refused before reading (413), and so is a body that grows
  past the limit while it streams in (413, reading stops there);
* time: a body whose next bytes do not arrive within ``idle_s``, or that is not complete within ``total_s``,
  gets 408 (a client that stalls mid-body no longer holds a handler, a score_trees queue place or a worker
  forever); a client that hangs up mid-body gets 400 (nobody reads it, but the handler ends at once).

Answering before the whole body was received is safe for the connection: :mod:`sglang_specopd.server.http.guard`
drains what is left before the answer goes out when the connection is to be closed after it.

:func:`json_body` adds :func:`sglang_specopd.wire.strict_json.loads` (nesting depth, NaN / Infinity, duplicate
keys: 400 with the reason). Limits: ``SPECOPD_MAX_PAYLOAD_BYTES`` (default 64 MiB, shared with
:func:`sglang_specopd.server.http.errors.max_payload_bytes`), ``SPECOPD_BODY_IDLE_S`` (default 30 s) and
``SPECOPD_BODY_TOTAL_S`` (default 300 s).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Optional

from sglang_specopd.server.http.errors import error_response, max_payload_bytes

BODY_IDLE_ENV = "SPECOPD_BODY_IDLE_S"
BODY_TOTAL_ENV = "SPECOPD_BODY_TOTAL_S"
DEFAULT_BODY_IDLE_S = 30.0
DEFAULT_BODY_TOTAL_S = 300.0


class BodyError(Exception):
    """A body refused before (or while) it was read: the HTTP ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message

    def response(self):
        """The JSON error reply (:func:`~sglang_specopd.server.http.errors.error_response`)."""
        return error_response(self.status, self.message)


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


def body_timeouts() -> tuple:
    """``(idle_s, total_s)`` from ``SPECOPD_BODY_IDLE_S`` / ``SPECOPD_BODY_TOTAL_S`` (bad or <= 0: defaults)."""
    return _env_seconds(BODY_IDLE_ENV, DEFAULT_BODY_IDLE_S), _env_seconds(BODY_TOTAL_ENV, DEFAULT_BODY_TOTAL_S)


async def read_body(request, limit: Optional[int] = None, idle_s: Optional[float] = None,
                    total_s: Optional[float] = None) -> bytes:
    """The whole body of ``request`` (a Starlette Request), at most ``limit`` bytes (default: the payload limit).

    Raises:
        BodyError: 413 (declared or actual size over ``limit``), 408 (no bytes for ``idle_s`` seconds, or not
            complete after ``total_s``), 400 (a malformed ``Content-Length``, or the client hung up mid-body).
    """
    return b"".join([chunk async for chunk in iter_body(request, limit, idle_s, total_s)])


async def iter_body(request, limit: Optional[int] = None, idle_s: Optional[float] = None,
                    total_s: Optional[float] = None, limit_name: str = ""):
    """The body of ``request`` chunk by chunk, as it arrives (bounded memory: the caller keeps or writes each
    chunk), with :func:`read_body`'s bounds and BodyErrors; ``limit_name`` ends the 413 reason (what sets the
    limit)."""
    from starlette.requests import ClientDisconnect

    limit = max_payload_bytes() if limit is None else limit
    default_idle, default_total = body_timeouts()
    idle_s = default_idle if idle_s is None else idle_s
    total_s = default_total if total_s is None else total_s
    tail = f" ({limit_name})" if limit_name else ""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise BodyError(400, f"malformed Content-Length header {declared[:40]!r}")
        if int(declared) > limit:
            raise BodyError(413, f"payload of {int(declared)} bytes exceeds the limit of {limit} bytes{tail}")
    size = 0
    deadline = time.monotonic() + total_s
    stream = request.stream().__aiter__()
    while True:
        wait = min(idle_s, deadline - time.monotonic())
        if wait <= 0:
            raise BodyError(408, f"request body not complete after {total_s:g} s ({size} bytes received)")
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout=wait)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            if time.monotonic() >= deadline:
                raise BodyError(408, f"request body not complete after {total_s:g} s ({size} bytes received)")
            raise BodyError(408, f"no request body bytes for {idle_s:g} s ({size} bytes received)") from None
        except ClientDisconnect:
            raise BodyError(400, f"the client closed the connection mid-body ({size} bytes received)") from None
        size += len(chunk)
        if size > limit:
            raise BodyError(413, f"payload of more than {limit} bytes exceeds the limit of {limit} bytes{tail}")
        if chunk:
            yield chunk


async def json_body(request, what: str = "body", **limits) -> Any:
    """:func:`read_body` then :func:`sglang_specopd.wire.strict_json.loads`; BodyError 400 for bad JSON."""
    from sglang_specopd.wire.strict_json import JSONBodyError, loads

    body = await read_body(request, **limits)
    try:
        return loads(body, what=what)
    except JSONBodyError as exc:
        raise BodyError(400, str(exc)) from None
