"""A counting reverse proxy between the trainer subprocess and the server: every trainer request's HTTP status.

The trainer (``specopd train specopd``) is a separate process whose HTTP client retries 5xx and raises on 4xx, so
its statuses are invisible from outside; it is pointed at this proxy instead of the server. The proxy forwards
each request unchanged (method, path, body, content type, authorization), waits for the whole reply and sends it
back, counting per reply: the error key (status >= 400, or ``"connection"`` when the server could not be
reached: the trainer then gets a 502 from the proxy, which is not a server 5xx), malformed replies (a 200
score_trees reply that is not a safetensors payload, a 200 JSON reply that does not parse), the time of the first
score_trees call (the trainer's first training step), the successful drafter swaps, and each score_trees reply's
queue wait (the server's ``X-SpecOPD-Queue-Wait-S`` header: how long the request waited for its turn).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional, Tuple
from urllib.parse import urlsplit

from sglang_specopd.wire.protocol import (ADMIN_KEY_HEADER, BINARY_CONTENT_TYPE, QUEUE_WAIT_HEADER, SCORE_TREES_PATH,
                                         SWAP_DRAFTER_PATH)

from .stats import status_key

FORWARD_HEADERS = ("Content-Type", "Authorization", "Accept", ADMIN_KEY_HEADER)  # the admin key: hidden / features


def reply_malformed(path: str, status: int, content_type: str, body: bytes) -> bool:
    """True for a 200 reply that does not parse: score_trees must be a safetensors payload (8-byte little-endian
    header length, then that many bytes of JSON), a JSON reply must parse (a swap's must carry ``version``)."""
    if status != 200:
        return False
    if path == SCORE_TREES_PATH:
        if not content_type.startswith(BINARY_CONTENT_TYPE) or len(body) < 8:
            return True
        n = int.from_bytes(body[:8], "little")
        try:
            return n <= 0 or 8 + n > len(body) or not isinstance(json.loads(body[8:8 + n]), dict)
        except ValueError:
            return True
    if content_type.startswith("application/json"):
        try:
            obj = json.loads(body)
        except ValueError:
            return True
        return path == SWAP_DRAFTER_PATH and not (isinstance(obj, dict) and "version" in obj)
    return False


class CountingProxy:
    """HTTP proxy on ``127.0.0.1:<free port>`` to ``upstream`` (``http://host:port``); :attr:`url` is its address.

    ``record(error_key_or_None, malformed)`` is called once per forwarded request; ``clock()`` gives the time
    stamps of :attr:`first_score_s` (first score_trees request sent) and :attr:`swap_times_s` (successful swaps).
    Use as a context manager (serves on a daemon thread).
    """

    def __init__(self, upstream: str, record: Callable[[Optional[str], bool], None], clock: Callable[[], float],
                 timeout_s: float = 900.0):
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.record, self.clock, self.timeout_s = record, clock, timeout_s
        self.first_score_s: Optional[float] = None
        self.swap_times_s: List[float] = []
        self.score_waits: List[Tuple[float, float, int]] = []  # (time on the soak clock, queue wait s, status)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="soak-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "CountingProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def forward(self, method: str, path: str, headers: dict, body: bytes):
        """Send one request upstream; (status, content type, body) or None when the server cannot be reached."""
        if path.startswith(SCORE_TREES_PATH):
            with self._lock:
                if self.first_score_s is None:
                    self.first_score_s = self.clock()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            ctype = resp.getheader("Content-Type", "")
        except (OSError, http.client.HTTPException):
            self.record("connection", False)
            return None
        finally:
            conn.close()
        self.record(status_key(resp.status), reply_malformed(path.split("?")[0], resp.status, ctype, data))
        wait = queue_wait_of(resp.getheader(QUEUE_WAIT_HEADER)) if path.startswith(SCORE_TREES_PATH) else None
        if wait is not None:
            with self._lock:
                self.score_waits.append((self.clock(), wait, resp.status))
        if resp.status == 200 and path.startswith(SWAP_DRAFTER_PATH):
            with self._lock:
                self.swap_times_s.append(self.clock())
        return resp.status, ctype, data

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {k: self.headers[k] for k in FORWARD_HEADERS if self.headers.get(k)}
                got = proxy.forward(self.command, self.path, headers, body)
                status, ctype, data = got if got is not None else (502, "text/plain", b"proxy: upstream unreachable")
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _relay

            def log_message(self, *args) -> None:  # quiet
                pass

        return Handler


def queue_wait_of(value: Optional[str]) -> Optional[float]:
    """The seconds in a ``X-SpecOPD-Queue-Wait-S`` header value; None when absent or not a finite number >= 0."""
    try:
        wait = float(value) if value is not None else None
    except ValueError:
        return None
    return wait if wait is not None and 0 <= wait < float("inf") else None


def monotonic_clock(origin: float) -> Callable[[], float]:
    """``perf_counter() - origin``: the soak's clock."""
    return lambda: time.perf_counter() - origin
