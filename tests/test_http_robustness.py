"""Every client of the plugin's routes gets an HTTP answer: no 5xx and no connection reset for bad input (issue 41).

Against conftest's shared ``tiny_admin_server`` (real SGLang server: uvicorn + h11 on uvloop, admin key, 1 MB payload
limit, a stalled body answered 408 after 3 s), with raw sockets so that what the client sees is exactly what the
server sent, reset included:

* the resets clients saw on bodies as small as ``[]``: a 500 (deeply nested JSON: RecursionError in the decoder)
  made uvicorn close the keep-alive connection with the client's next request unread (a RST); two requests
  pipelined on one connection reproduce it deterministically;
* the keep-alive timer closing a connection whose next request arrived while the HTTP event loop was busy (the
  HTTP process is stopped with SIGSTOP across the expiry to make the loop busy on cue);
* an early answer (413 on the declared size, 401 from SGLang's auth) to a ``Connection: close`` upload;
* a stalled body (408), strict JSON refusals (400 with the reason), and ``GET /specopd/drafter`` without server
  paths for callers other than the admin.

The ConnectionGuard's own logic is checked without a server on a stand-in ASGI app.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import time
from typing import List, Optional, Tuple

import httpx
import pytest

from conftest import TINY_ADMIN_KEY, TINY_BODY_IDLE_S, TINY_MAX_PAYLOAD, RunningServer
from sglang_specopd.server.http.guard import ConnectionGuard, closes_after, has_body
from sglang_specopd.wire.protocol import DRAFTER_ADMIN_INFO_PATH, DRAFTER_INFO_PATH, SCORE_TREES_PATH, SWAP_DRAFTER_PATH

ADMIN = f"Bearer {TINY_ADMIN_KEY}"
DEEP = b"[" * 3000  # the body: RecursionError in the stdlib JSON decoder before the fix
KEEP_ALIVE_S = 5.0  # SGLang's SGLANG_TIMEOUT_KEEP_ALIVE default (uvicorn's timeout_keep_alive)


# ---------------------------------------------------------------------------------------------------------------
# Raw HTTP/1.1 over a socket
# ---------------------------------------------------------------------------------------------------------------


def request_bytes(path: str, body: bytes = b"", method: str = "POST", headers: Optional[dict] = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Conn:
    """One raw client connection; :meth:`answer` reads the next HTTP answer (pipelined answers in order)."""

    def __init__(self, srv: RunningServer):
        self.sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def __enter__(self) -> "Conn":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError(f"connection closed before an answer ({self.buf[:80]!r})")
        self.buf += chunk

    def answer(self, timeout: float = 120.0) -> Tuple[int, dict, bytes]:
        """(status, headers lower-cased, body). Raises ConnectionResetError / EOFError when the server reset or
        closed the connection instead of answering."""
        self.sock.settimeout(timeout)
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, rest = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        length = int(headers.get("content-length", "0"))
        self.buf = rest
        while len(self.buf) < length:
            self._more()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(lines[0].split()[1]), headers, body

    def closed_by_server(self) -> bool:
        """Whether the server's FIN (or data) is already waiting to be read."""
        return bool(select.select([self.sock], [], [], 0)[0])


def outcome(conn: Conn, timeout: float = 120.0) -> str:
    """``"<status>"`` of the next answer, or what happened instead (``"reset"``, ``"eof"``)."""
    try:
        return str(conn.answer(timeout)[0])
    except ConnectionResetError:
        return "reset"
    except (EOFError, BrokenPipeError):
        return "eof"


# ---------------------------------------------------------------------------------------------------------------
# The ConnectionGuard on a stand-in ASGI app (no server)
# ---------------------------------------------------------------------------------------------------------------


def _run_asgi(app, scope: dict, incoming: List[dict]) -> Tuple[List[dict], List[dict]]:
    """Run ``app`` with ``incoming`` receive messages; (messages sent, messages it left unread)."""
    sent, queue = [], list(incoming)

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent, queue


def _scope(headers=(), version="1.1") -> dict:
    return {"type": "http", "method": "POST", "path": "/x", "http_version": version,
            "headers": [(k.encode(), v.encode()) for k, v in headers]}


async def _answer_500_then_raise(scope, receive, send):
    """What Starlette's ServerErrorMiddleware does with an exception: a complete 500, then re-raise."""
    await send({"type": "http.response.start", "status": 500, "headers": []})
    await send({"type": "http.response.body", "body": b"Internal Server Error"})
    raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")


async def _raise_mid_answer(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"part", "more_body": True})
    raise RuntimeError("stream broke")


async def _answer_at_once(scope, receive, send):
    """An early answer that never reads the body (SGLang's auth middleware, a 413 on the declared size)."""
    await send({"type": "http.response.start", "status": 401, "headers": []})
    await send({"type": "http.response.body", "body": b'{"error": "Unauthorized"}'})


def test_guard_keeps_the_connection_after_a_complete_answer_only() -> None:
    sent, _ = _run_asgi(ConnectionGuard(_answer_500_then_raise), _scope(), [])
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [500]  # swallowed: no raise
    with pytest.raises(RuntimeError, match="stream broke"):  # mid-answer: uvicorn must close the connection
        _run_asgi(ConnectionGuard(_raise_mid_answer), _scope(), [])


def test_guard_drains_an_unread_body_before_an_early_answer_on_a_closing_connection() -> None:
    body = [{"type": "http.request", "body": b"x" * 1000, "more_body": True} for _ in range(5)]
    body.append({"type": "http.request", "body": b"end", "more_body": False})
    closing = _scope([("content-length", "5003"), ("connection", "close")])
    sent, left = _run_asgi(ConnectionGuard(_answer_at_once), closing, list(body))
    assert left == [] and sent[0]["status"] == 401  # every body message read before the answer went out
    keep_alive = _scope([("content-length", "5003")])  # uvicorn drains keep-alive connections itself
    _, left = _run_asgi(ConnectionGuard(_answer_at_once), keep_alive, list(body))
    assert len(left) == 6
    expect = _scope([("content-length", "5003"), ("connection", "close"), ("expect", "100-continue")])
    _, left = _run_asgi(ConnectionGuard(_answer_at_once), expect, list(body))
    assert len(left) == 6  # a client waiting for 100-continue sends no body after a final answer
    stalled = ConnectionGuard(_answer_at_once, drain_idle_s=0.2)
    t0 = time.monotonic()
    sent, left = _run_asgi(stalled, closing, body[:2])  # the client stops sending: give up after the idle time
    assert left == [] and sent[0]["status"] == 401 and time.monotonic() - t0 < 2.0
    assert closes_after(_scope(version="1.0")) and not closes_after(_scope())
    assert has_body(_scope([("transfer-encoding", "chunked")])) and not has_body(_scope([("content-length", "0")]))


# ---------------------------------------------------------------------------------------------------------------
# Against the real server
# ---------------------------------------------------------------------------------------------------------------

server = pytest.mark.server


@pytest.fixture(scope="module")
def srv(tiny_admin_server: RunningServer) -> RunningServer:
    return tiny_admin_server


@server
@pytest.mark.parametrize("path,first,headers", [
    (SCORE_TREES_PATH, DEEP, {"Content-Type": "application/json"}),
    (SCORE_TREES_PATH, b'{"references": ' + b"[" * 2000, {"Content-Type": "application/json"}),
    (SWAP_DRAFTER_PATH, b'{"path": ' + b'{"a": ' * 2000, {"Authorization": ADMIN}),
], ids=["score_trees-array", "score_trees-object", "swap-object"])
def test_a_bad_body_does_not_cost_the_next_request_on_the_connection(srv, path, first, headers) -> None:
    """The issue's resets: two requests pipelined on one keep-alive connection, the first a deeply nested body.
    Before the fix the first was answered 500 and the second (``[]`` / ``-1``) was reset."""
    with Conn(srv) as conn:
        conn.send(request_bytes(path, first, headers=headers) + request_bytes(SCORE_TREES_PATH, b"[]")
                  + request_bytes(SCORE_TREES_PATH, b"-1"))
        answers = [outcome(conn) for _ in range(3)]
    assert answers == ["400", "400", "400"], answers


@server
def test_refusals_say_why(srv) -> None:
    """Strict JSON and bounds: 400 / 413 with the reason, never a 5xx."""
    cases = {
        DEEP: "nested 3000 levels deep",
        b'{"references": [{"input_ids": [1, NaN]}], "block_size": 4}': "NaN is not allowed",
        b'{"references": [], "block_size": 4, "block_size": 8}': "duplicate key 'block_size'",
        b'{"references": [{"input_ids": [1, 2], "trees": [{"anch': "not valid JSON",
        b'{"references": [{"input_ids": [' + b"9" * 5000 + b"]}], \"block_size\": 4}": "not valid JSON",
        b'{"references": [{"input_ids": [-1, 99999999999999999999999]}], "block_size": 4}': "input_ids",
        b"\xff\xfe": "not UTF-8",
        b"-1": "invalid score_trees request",
    }
    with httpx.Client(base_url=srv.url, timeout=120) as client:
        for body, reason in cases.items():
            r = client.post(SCORE_TREES_PATH, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and reason in r.json()["error"]["message"], (body[:60], r.text[:300])
        r = client.post(SWAP_DRAFTER_PATH, content=b'{"path": "/x", "path": "/y"}', headers={"Authorization": ADMIN})
        assert r.status_code == 400 and "duplicate key 'path'" in r.json()["error"]["message"], r.text
        r = client.post(SCORE_TREES_PATH, content=b"[" * (TINY_MAX_PAYLOAD + 1))
        assert r.status_code == 413 and f"limit of {TINY_MAX_PAYLOAD} bytes" in r.json()["error"]["message"]


@server
@pytest.mark.parametrize("path,headers,status", [
    (SCORE_TREES_PATH, {"Content-Type": "application/json"}, 413),  # declared size over the limit: no body read
    (SWAP_DRAFTER_PATH, {}, 401),  # SGLang's auth middleware, before the body is read
], ids=["413-declared-size", "401-auth"])
def test_an_early_answer_reaches_a_connection_close_upload(srv, path, headers, status) -> None:
    """A ``Connection: close`` client uploading 8 MB: answered before its body was read, the server used to close
    the socket under the upload (the client saw a reset instead of the answer)."""
    body = b"x" * (8 * TINY_MAX_PAYLOAD)
    with Conn(srv) as conn:
        try:
            conn.send(request_bytes(path, body, headers={**headers, "Connection": "close"}))
            got = outcome(conn)
        except (ConnectionResetError, BrokenPipeError):
            got = "reset while sending"
    assert got == str(status), got


@server
def test_a_stalled_body_gets_408(srv) -> None:
    """Half a body, then nothing: 408 after the idle time (``SPECOPD_BODY_IDLE_S``), and the place in the
    score_trees line is free again (a valid request right after is scored)."""
    body = json.dumps({"references": [{"input_ids": [5, 6, 7], "trees": [{"anchor": 1, "branches": [[9]]}]}],
                       "block_size": 4}).encode()
    with Conn(srv) as conn:
        head = request_bytes(SCORE_TREES_PATH, body, headers={"Content-Type": "application/json"})
        conn.send(head[: len(head) - len(body) // 2])
        t0 = time.monotonic()
        status, _, reply = conn.answer(timeout=TINY_BODY_IDLE_S + 60)
        waited = time.monotonic() - t0
    assert status == 408 and "no request body bytes" in json.loads(reply)["error"]["message"], reply
    assert TINY_BODY_IDLE_S - 0.5 <= waited < TINY_BODY_IDLE_S + 30, waited
    r = httpx.post(srv.url + SCORE_TREES_PATH, content=body, timeout=120)
    assert r.status_code == 200, r.text[:300]


def _http_pid(port: int) -> int:
    """The SGLang HTTP process (uvicorn) listening on ``port``."""
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise AssertionError(f"no process listens on port {port}")


@server
def test_keep_alive_expiry_while_the_event_loop_is_busy(srv) -> None:
    """A request sent just before the keep-alive expiry while the HTTP process's event loop is busy (here: stopped
    with SIGSTOP for 0.6 s across the expiry) is answered; uvloop runs the expired keep-alive timer before it reads
    the socket, and the timer used to close the connection over the waiting request (a reset)."""
    assert "SGLANG_TIMEOUT_KEEP_ALIVE" not in os.environ
    pid = _http_pid(srv.port)
    results = []
    for attempt in range(3):
        with Conn(srv) as conn:
            conn.send(request_bytes(SCORE_TREES_PATH, b"[]"))
            assert conn.answer()[0] == 400
            answered = time.monotonic()
            time.sleep(KEEP_ALIVE_S - 0.4)
            os.kill(pid, signal.SIGSTOP)
            try:
                closed_already = conn.closed_by_server()  # FIN already here: the timer beat us to it
                conn.send(request_bytes(SCORE_TREES_PATH, b"[]"))
                time.sleep(max(0.0, answered + KEEP_ALIVE_S + 0.2 - time.monotonic()))
            finally:
                os.kill(pid, signal.SIGCONT)
            if closed_already:
                results.append("closed before the stall (machine too slow for this timing)")
                continue
            results.append(outcome(conn))
            break
    assert results[-1] == "400", results


@server
def test_drafter_info_shows_server_paths_only_to_the_admin(srv) -> None:
    public = httpx.get(srv.url + DRAFTER_INFO_PATH, timeout=60)
    assert public.status_code == 200
    info = public.json()
    assert "path" not in info and info["name"] == os.path.basename(srv.spec.drafter_path), info
    assert info["version"] and info["arch"] == "dflash" and info["spec"]["block_size"] == 4
    text = json.dumps(info)
    assert srv.spec.drafter_path not in text and os.path.dirname(srv.spec.drafter_path) not in text, text
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert httpx.get(srv.url + DRAFTER_ADMIN_INFO_PATH, headers=headers, timeout=60).status_code == 401
    admin = httpx.get(srv.url + DRAFTER_ADMIN_INFO_PATH, headers={"Authorization": ADMIN}, timeout=60).json()
    assert admin["path"] == srv.spec.drafter_path
    assert {k: v for k, v in admin.items() if k != "path"} == {k: v for k, v in info.items() if k != "name"}


def test_the_cpu_engines_children_started_by_fork(srv) -> None:
    """CPU adaptation 17 (cpu/fork_start.py) on a real server: the scheduler and detokenizer were forked from the
    launcher (its log line), and the server answers (the rest of this module)."""
    log = srv.log_path.read_text(errors="replace")
    assert "scheduler and detokenizer start by fork" in log, log[-2000:]
