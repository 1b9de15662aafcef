"""A background daemon thread with start/stop, the base of the fuzzer and the RSS sampler."""

from __future__ import annotations

import threading


class Background:
    """Runs ``self._run()`` on a daemon thread named ``name``; ``_run`` polls ``self._stop`` (a threading.Event)
    and returns once it is set. :meth:`stop` sets it and joins for at most ``join_s`` seconds."""

    def __init__(self, name: str, join_s: float = 10.0):
        self._stop = threading.Event()
        self._join_s = join_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._join_s)
