"""Every client gets an HTTP answer, not a connection reset: guards around SGLang's HTTP server (uvicorn, h11).

Clients saw "Connection reset by peer" on bodies as small as ``[]`` (issue 41). Three ways the server closed a
connection that still had client bytes unread (the kernel then answers those bytes with a TCP RST, and the client
loses its request or the answer), each reproduced against a real server in ``tests/test_http_robustness.py``:

1. **An exception after the answer.** A route that raises is answered 500 by Starlette's ServerErrorMiddleware,
   which then re-raises; uvicorn logs "Exception in ASGI application" and, because the answer had started, closes
   the keep-alive connection. The client, holding a complete 500, sends its next request on that pooled
   connection and gets a reset: one reset per 500, on whatever came next (the issue's 12 x 500 from deeply
   nested JSON and 11 resets). :class:`ConnectionGuard` logs such an exception and keeps the connection when the
   answer was complete (the HTTP framing is intact); an exception in the middle of an answer still closes it.
2. **The keep-alive timer firing over a waiting request.** uvicorn closes an idle keep-alive connection from a
   timer (``SGLANG_TIMEOUT_KEEP_ALIVE``, 5 s). SGLang runs uvicorn on uvloop, whose loop runs due timers BEFORE
   it polls sockets: when the HTTP process's event loop was busy across the expiry (a long callback, a
   garbage-collection pause, a parsing thread holding the GIL), the timer closes a connection whose next request
   has already arrived. :func:`patch_keep_alive` makes the timer leave a connection with unread bytes alone
   (they are the next request; uvicorn's read callback cancels the timer in the same loop iteration).
3. **An early answer on a connection that closes after it.** An answer sent before the body was read (413 on a
   declared size, 401 / 403 from SGLang's auth middleware, 408) to a ``Connection: close`` (or HTTP/1.0) request
   makes uvicorn close the socket while the client is still sending: the client gets a reset instead of the
   answer. :class:`ConnectionGuard` drains the rest of such a body first (at most :data:`DRAIN_MAX_BYTES` or
   :data:`DRAIN_MAX_S`, stopping after :data:`DRAIN_IDLE_S` without bytes); keep-alive connections need no
   drain (uvicorn reads and discards the rest of the body after the answer).

:func:`install` wraps SGLang's FastAPI app (outermost, around SGLang's own auth middleware) and patches uvicorn;
it is called by :func:`sglang_specopd.server.routes.add_routes` in the HTTP process before uvicorn starts.
uvicorn is SGLang's HTTP server, not SGLang: it is patched here, by attribute, and a uvicorn without the
attribute is left alone with a warning (the guard then only covers cases 1 and 3).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

logger = logging.getLogger("sglang_specopd.server.http.guard")

DRAIN_MAX_BYTES = 256 * 2**20
DRAIN_MAX_S = 15.0
DRAIN_IDLE_S = 1.0


def _header(scope, name: bytes) -> Optional[bytes]:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def closes_after(scope) -> bool:
    """Whether the connection closes after this request's answer: ``Connection: close`` or HTTP/1.0."""
    conn = (_header(scope, b"connection") or b"").lower()
    return b"close" in conn or scope.get("http_version") == "1.0"


def has_body(scope) -> bool:
    """Whether the request declares a body (``Content-Length`` > 0 or chunked)."""
    length = _header(scope, b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"chunked" in (_header(scope, b"transfer-encoding") or b"").lower()


class ConnectionGuard:
    """Outermost ASGI wrapper: keeps a connection whose answer completed before an exception, and drains an
    unread body before an early answer on a connection that closes after it (module docstring, cases 1 and 3)."""

    def __init__(self, app, drain_max_bytes: int = DRAIN_MAX_BYTES, drain_max_s: float = DRAIN_MAX_S,
                 drain_idle_s: float = DRAIN_IDLE_S):
        self.app = app
        self.drain_max_bytes, self.drain_max_s, self.drain_idle_s = drain_max_bytes, drain_max_s, drain_idle_s

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        state = {"body_done": not has_body(scope), "complete": False, "drained": 0}
        expect_continue = b"100-continue" in (_header(scope, b"expect") or b"").lower()
        drain_first = closes_after(scope) and not expect_continue

        async def guarded_receive():
            message = await receive()
            if message.get("type") == "http.disconnect" or not message.get("more_body", False):
                state["body_done"] = True
            return message

        async def guarded_send(message):
            if message.get("type") == "http.response.start" and drain_first and not state["body_done"]:
                await self._drain(receive, state)
            await send(message)
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            if not state["complete"]:
                raise  # mid-answer: uvicorn must close the connection (the client cannot frame the rest)
            logger.exception("exception after a complete answer to %s %s (connection kept)",
                             scope.get("method"), scope.get("path"))

    async def _drain(self, receive, state) -> None:
        """Read and drop the rest of the body, bounded by bytes, total time and idle time."""
        deadline = time.monotonic() + self.drain_max_s
        while not state["body_done"] and state["drained"] <= self.drain_max_bytes:
            wait = min(self.drain_idle_s, deadline - time.monotonic())
            if wait <= 0:
                return
            try:
                message = await asyncio.wait_for(receive(), timeout=wait)
            except asyncio.TimeoutError:
                return
            if message.get("type") == "http.disconnect" or not message.get("more_body", False):
                state["body_done"] = True
            state["drained"] += len(message.get("body", b"") or b"")


def unread_bytes(transport) -> Optional[int]:
    """Bytes waiting in the kernel's receive buffer of ``transport``'s socket (None when it cannot be told)."""
    import array
    import fcntl
    import termios

    sock = transport.get_extra_info("socket") if transport is not None else None
    try:
        fd = sock.fileno()
        if fd < 0:
            return None
        buf = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
        return int(buf[0])
    except (AttributeError, OSError, ValueError):
        return None


def _keep_alive_unless_pending(original):
    def timeout_keep_alive_handler(self, *args, **kwargs):
        if (unread_bytes(getattr(self, "transport", None)) or 0) > 0:
            return None  # the next request is here: data_received runs this iteration and cancels the timer
        return original(self, *args, **kwargs)

    timeout_keep_alive_handler.__wrapped__ = original
    timeout_keep_alive_handler._specopd_guard = True
    return timeout_keep_alive_handler


def patch_keep_alive() -> bool:
    """Patch uvicorn's HTTP/1.1 protocols so that the keep-alive timer never closes a connection with unread
    bytes (module docstring, case 2). True when the h11 protocol (the one SGLang runs without httptools) is
    patched; idempotent."""
    import importlib

    patched = False
    for module_name, cls_name in (("uvicorn.protocols.http.h11_impl", "H11Protocol"),
                                  ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol")):
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError):
            continue
        original = getattr(cls, "timeout_keep_alive_handler", None)
        if original is None:
            logger.warning("%s.%s has no timeout_keep_alive_handler: keep-alive guard not installed",
                           module_name, cls_name)
            continue
        if not getattr(original, "_specopd_guard", False):
            cls.timeout_keep_alive_handler = _keep_alive_unless_pending(original)
        patched = patched or cls_name == "H11Protocol"
    return patched


def install(app) -> None:
    """Wrap ``app`` (a Starlette / FastAPI app whose middleware stack is not built yet) in :class:`ConnectionGuard`,
    outermost, and patch uvicorn's keep-alive timer. Idempotent."""
    if not getattr(app, "_specopd_guarded", False):
        build = app.build_middleware_stack

        def build_middleware_stack():
            return ConnectionGuard(build())

        app.build_middleware_stack = build_middleware_stack
        app._specopd_guarded = True
    patch_keep_alive()
