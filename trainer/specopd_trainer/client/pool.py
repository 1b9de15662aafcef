"""Several replicas of one served target behind one ``generate`` call: the least-loaded replica takes each request.

Data parallelism for collection: on a machine where one server cannot use every core (decode on CPU does not
scale past one thread at these batch sizes, docs/cpu_adaptations.md), or across GPU replicas, the corpus is
regenerated through N servers at once. :func:`specopd_trainer.collect.regenerate` only calls ``generate``, so a
:class:`ClientPool` stands in for a :class:`~specopd_trainer.client.http.SpecOPDClient` there. Greedy responses do not
depend on which replica served them (same weights, same config); sampled ones carry their own seed.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Sequence


class ClientPool:
    """Dispatch ``generate`` to the replica with the fewest requests in flight (ties: the lowest index).

    Args:
        clients: one client per replica (objects with ``generate(input_ids, **params) -> dict``); at least one.

    Raises:
        ValueError: ``clients`` is empty.
    """

    def __init__(self, clients: Sequence[Any]):
        if not clients:
            raise ValueError("ClientPool needs at least one client")
        self.clients = list(clients)
        self.in_flight = [0] * len(self.clients)
        self.served = [0] * len(self.clients)
        self._lock = threading.Lock()

    def _acquire(self) -> int:
        with self._lock:
            i = min(range(len(self.clients)), key=lambda k: (self.in_flight[k], k))
            self.in_flight[i] += 1
            return i

    def _release(self, i: int) -> None:
        with self._lock:
            self.in_flight[i] -= 1
            self.served[i] += 1

    def generate(self, input_ids: List[int], **params: Any) -> Dict[str, Any]:
        """``generate`` on the least-loaded replica; its reply (and any exception) unchanged."""
        i = self._acquire()
        try:
            return self.clients[i].generate(input_ids, **params)
        finally:
            self._release(i)
