"""Which worker of a fleet takes a request the router cannot route, and what happens when one drops out.

Rendezvous (highest-random-weight) hashing: for a request's affinity key (:func:`affinity_key` of a reference's
token ids), every worker gets the score ``blake2b(url, key)`` and the workers are tried in decreasing score
(:func:`rendezvous_order`). The same reference always goes to the same worker first, so that worker's
``score_trees`` prefix cache (keyed by the reference's ids, docs/prefix_cache.md) is reused across calls; different
references spread evenly over the workers; a worker leaving or joining moves only the keys it ranks first.

Failover (:func:`call_with_failover`): the request goes to the first worker of that order; a worker that drops out
(:class:`~specopd_trainer.client.http.ServerUnavailableError`: connection refused, timeout or 5xx after its client's own
retries) is marked down in :class:`WorkerHealth` and the same request goes to the next worker; nothing is dropped.
A down worker is tried after the live ones for ``cooldown_s`` seconds (it keeps its place in every order, so it
gets its keys back once it answers again). A 4xx (a bad request, a refused key) or a 429 after the client's waits is
the request's own problem and is raised at once, never retried elsewhere.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
from typing import Callable, Dict, List, Sequence, Tuple, TypeVar

from specopd_trainer.client.http import ServerUnavailableError

T = TypeVar("T")


class FleetUnavailableError(ServerUnavailableError):
    """Every worker failed the request (each one's reason in the message, and in :attr:`failures`)."""

    def __init__(self, what: str, failures: Sequence[Tuple[str, str]]):
        detail = "; ".join(f"{url}: {reason[:200]}" for url, reason in failures)
        super().__init__(f"{what}: every worker failed ({detail})")
        self.failures = tuple(failures)


def affinity_key(input_ids: Sequence[int]) -> bytes:
    """The affinity key of a token sequence: blake2b-128 of its ids as little-endian int64 (length included)."""
    ids = [int(t) for t in input_ids]
    return hashlib.blake2b(struct.pack(f"<{len(ids)}q", *ids), digest_size=16).digest()


def rendezvous_order(key: bytes, workers: Sequence[str]) -> List[str]:
    """``workers`` in decreasing rendezvous score for ``key`` (ties, which need equal 64-bit hashes, by URL)."""
    def score(url: str) -> Tuple[int, str]:
        digest = hashlib.blake2b(url.encode() + b"\0" + key, digest_size=8).digest()
        return -int.from_bytes(digest, "big"), url

    return sorted(workers, key=score)


class WorkerHealth:
    """Which workers failed recently (thread-safe). ``cooldown_s``: how long a failed worker is tried last."""

    def __init__(self, cooldown_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        self.cooldown_s, self.clock = float(cooldown_s), clock
        self._down_until: Dict[str, float] = {}
        self.failures: Dict[str, int] = {}  # url -> requests it failed
        self._lock = threading.Lock()

    def mark_down(self, url: str) -> None:
        with self._lock:
            self._down_until[url] = self.clock() + self.cooldown_s
            self.failures[url] = self.failures.get(url, 0) + 1

    def mark_up(self, url: str) -> None:
        with self._lock:
            self._down_until.pop(url, None)

    def is_down(self, url: str) -> bool:
        with self._lock:
            until = self._down_until.get(url)
            return until is not None and self.clock() < until

    def order(self, preferred: Sequence[str]) -> List[str]:
        """``preferred`` with the workers marked down (and still cooling down) moved to the end, order kept."""
        down = [u for u in preferred if self.is_down(u)]
        return [u for u in preferred if u not in down] + down


def call_with_failover(order: Sequence[str], call: Callable[[str], T], health: WorkerHealth, *,
                       what: str = "request", on_failover: Callable[[str, str], None] | None = None) -> T:
    """``call(url)`` on the first worker of ``health.order(order)`` that answers.

    Args:
        order: the workers in preference order (:func:`rendezvous_order`). call: the request on one worker.
        on_failover: ``(url, reason)`` for every worker that dropped out before the answer.

    Raises:
        FleetUnavailableError: every worker raised :class:`ServerUnavailableError`. Any other exception of
            ``call`` (a 4xx, a malformed reply) propagates at once.
    """
    failures: List[Tuple[str, str]] = []
    for url in health.order(order):
        try:
            out = call(url)
        except ServerUnavailableError as exc:
            health.mark_down(url)
            failures.append((url, str(exc)))
            if on_failover is not None:
                on_failover(url, str(exc))
            continue
        health.mark_up(url)
        return out
    raise FleetUnavailableError(what, failures)
