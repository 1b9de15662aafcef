"""SIGINT / SIGTERM stop a ``specopd adapt`` run after its current step (the loop checkpoints on the way out)."""

from __future__ import annotations

import signal
from typing import Callable


def install_signals(stop: Callable[[str], None]):
    """Route SIGINT / SIGTERM to ``stop(name)``; the previous handlers (empty when not the main thread: the caller
    stops the run with ``request_stop``)."""
    try:
        return {s: signal.signal(s, lambda signum, frame: stop(signal.Signals(signum).name))
                for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        return {}


def restore_signals(handlers) -> None:
    for s, h in handlers.items():
        signal.signal(s, h)
