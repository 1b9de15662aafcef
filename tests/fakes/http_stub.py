"""An in-process HTTP stub server (:func:`stub_server`: GET/POST replies from a handler function) and small prompt
records (:func:`make_records`), for the collection and evaluation tests that need a server that answers on cue."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator, Tuple


Handler = Callable[[str, dict], Tuple[int, dict]]


@contextlib.contextmanager
def stub_server(handler: Handler) -> Iterator[str]:
    """A local HTTP server whose GET/POST replies are ``handler(path, json_body) -> (status, json)``; yields URL."""

    class _H(BaseHTTPRequestHandler):
        def _reply(self, body: dict) -> None:
            status, payload = handler(self.path, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            self._reply(json.loads(self.rfile.read(n) or b"{}"))

        def do_GET(self) -> None:  # noqa: N802
            self._reply({})

        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _H)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def make_records(n: int, prefix: str = "r", domains=("dialogue", "coding", "math", "agentic")) -> list:
    texts = ("Return the sum of the arguments.", "Open the file and read it.", "What is 17 times 3?",
             "Call the weather tool for Paris.", "Sort a list of numbers.", "Explain the difference of two sets.")
    return [{"id": f"{prefix}{i}", "domain": domains[i % len(domains)],
             "messages": [{"role": "user", "content": texts[i % len(texts)] + f" (case {i})"}]} for i in range(n)]
