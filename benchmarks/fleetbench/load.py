"""Load that shows drafter versions, and rollout calls that are timed.

:class:`VersionLoad` keeps ``loops`` closed-loop ``/generate`` clients per target (the router, or a worker directly)
busy in a background thread: each sends the next held-out prompt (greedy, ``ignore_eos``) as soon as its previous
request ended, and records one sample per request: send and end times (``time.monotonic``), HTTP status, the drafter
versions of ``meta_info["specopd_drafter_versions"]`` (kept by sglang-router 0.3.2 on ``/generate``; docs/fleet.md).
After a failure a loop waits :data:`ERROR_PAUSE_S` before its next request (a dead worker refuses at once; without
the pause its loop would count thousands of refusals).

:class:`TimedWorker` is the trainer's :class:`~specopd_trainer.fleet.worker.WorkerAdmin` with every rollout call
timed into a shared event list, and optional one-shot hooks run just before a call (the benchmark kills a worker
there: ``kill -9`` at its stage or its commit).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from specopd_trainer.fleet.worker import VERSIONS_KEY, Step, WorkerAdmin

ERROR_PAUSE_S = 0.5


class VersionLoad:
    """Closed-loop ``/generate`` load on ``targets`` = ``[(label, url, loops)]`` (see the module docstring); a context
    manager (start on enter; on exit stop sending and wait for the requests in flight).

    ``prompts``: token id lists, sent in turn (one shared counter); ``max_new_tokens`` per request; ``timeout_s``
    per request. ``samples``: one dict per finished request (``target``, ``t_send``, ``t_end``, ``ok``, ``status``,
    ``error``, ``versions``, ``completion_tokens``)."""

    def __init__(self, targets: Sequence[Tuple[str, str, int]], prompts: Sequence[Sequence[int]],
                 max_new_tokens: int, *, timeout_s: float = 300.0, headers: Optional[Mapping[str, str]] = None,
                 clock: Callable[[], float] = time.monotonic, transport: Any = None):
        if not prompts:
            raise ValueError("VersionLoad needs at least one prompt")
        self.targets = [(label, url.rstrip("/"), int(n)) for label, url, n in targets if n > 0]
        self.prompts = [list(p) for p in prompts]
        self.max_new_tokens, self.timeout_s = int(max_new_tokens), float(timeout_s)
        self.headers, self.clock, self.transport = dict(headers or {}), clock, transport  # transport: tests
        self.samples: List[Dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._next = itertools.count()
        self.t_start: Optional[float] = None
        self.t_stop: Optional[float] = None

    def _body(self) -> Dict[str, Any]:
        ids = self.prompts[next(self._next) % len(self.prompts)]
        return {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": self.max_new_tokens,
                                                      "ignore_eos": True}}

    async def _loop(self, client, label: str, url: str) -> None:
        while not self._stop.is_set():
            body, t0 = self._body(), self.clock()
            s: Dict[str, Any] = {"target": label, "t_send": t0, "ok": False, "status": None, "error": None,
                                 "versions": [], "completion_tokens": 0}
            try:
                r = await client.post(url + "/generate", json=body)
                s["status"] = r.status_code
                if r.status_code == 200:
                    meta = r.json().get("meta_info") or {}
                    s.update(ok=True, versions=list(meta.get(VERSIONS_KEY) or []),
                             completion_tokens=int(meta.get("completion_tokens") or 0))
                else:
                    s["error"] = f"HTTP {r.status_code}: {r.text[:200]}"
            except Exception as exc:  # noqa: BLE001 - any failure is a failed sample, never a dead loop
                s["error"] = f"{type(exc).__name__}: {exc}"[:300]
            s["t_end"] = self.clock()
            self.samples.append(s)
            await asyncio.sleep(0 if s["ok"] else ERROR_PAUSE_S)  # let the other loops run

    async def _main(self) -> None:
        import httpx

        n = sum(t[2] for t in self.targets)
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(headers=self.headers, timeout=httpx.Timeout(self.timeout_s, connect=10.0),
                                     limits=limits, transport=self.transport) as client:
            await asyncio.gather(*(self._loop(client, label, url) for label, url, k in self.targets
                                   for _ in range(k)))

    def start(self) -> "VersionLoad":
        self.t_start = self.clock()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="version-load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending; wait (up to the request timeout) for the requests in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 30.0)
        self.t_stop = self.clock()

    def __enter__(self) -> "VersionLoad":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class TimedWorker(WorkerAdmin):
    """A :class:`WorkerAdmin` whose ``stage``, ``commit``, ``abort`` and ``serving`` (the verification: ``op``
    ``verify``) append ``{"url", "op", "t0", "t1", "ok", "status", "error"}`` to ``events``; ``before[op]`` (a
    callable of the url, removed once run) runs first, inside the timed span."""

    def __init__(self, url: str, *, events: List[Dict[str, Any]], lock: threading.Lock,
                 clock: Callable[[], float] = time.monotonic, **kw):
        super().__init__(url, **kw)
        self.events, self.lock, self.clock = events, lock, clock
        self.before: Dict[str, Callable[[str], None]] = {}

    def _timed(self, op: str, call: Callable[[], Step]) -> Step:
        t0 = self.clock()
        hook = self.before.pop(op, None)
        if hook is not None:
            hook(self.url)
        step = call()
        with self.lock:
            self.events.append({"url": self.url, "op": op, "t0": t0, "t1": self.clock(), "ok": step.ok,
                                "status": step.status, "error": step.error})
        return step

    def stage(self, txn, update, ttl_s) -> Step:
        return self._timed("stage", lambda: super(TimedWorker, self).stage(txn, update, ttl_s))

    def commit(self, txn) -> Step:
        return self._timed("commit", lambda: super(TimedWorker, self).commit(txn))

    def abort(self, txn) -> Step:
        return self._timed("abort", lambda: super(TimedWorker, self).abort(txn))

    def serving(self, version, probe=None) -> Step:
        return self._timed("verify", lambda: super(TimedWorker, self).serving(version, probe))
