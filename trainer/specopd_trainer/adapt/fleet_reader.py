"""Reading every worker's traffic spool for ``specopd adapt`` against a fleet: one cursor per worker.

:class:`FleetTrafficReader` keeps one :class:`~specopd_trainer.adapt.reader.TrafficReader` per worker of a
:class:`~specopd_trainer.fleet.client.FleetClient`, each with its own :class:`~specopd_trainer.adapt.reader.Cursor`
(held in the adapter's state by worker URL, so a run resumes every worker's spool exactly where its last checkpoint
left it) and the shared counters. One :meth:`read` reads one page of every worker and returns their valid items
merged oldest first (by the time each request finished), each naming its ``worker``. Item keys stay
``<spool_id>:<seq>``: spool ids are random per server start, so keys never collide between workers, and the
held-out share (by a hash of the prompt) is the same on every worker: a prompt held out on one is held out on all.

A worker that does not answer (connection refused, timeout, 5xx after the client's retries) is skipped for this
read (``counts.unavailable``) and its cursor stays: what its spool holds is read once it answers again. A worker
that restarted has a new spool: its cursor starts again there (``counts.spool_restarts``), as for one server.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List

from specopd_trainer.adapt.reader import Cursor, ReaderCounts, ServedItem, TrafficReader
from specopd_trainer.client.http import ServerUnavailableError


class _WorkerPages:
    """One worker's spool pages through the fleet client (which remembers the spool as that worker's)."""

    def __init__(self, client, url: str):
        self.client, self.url = client, url

    def traffic_page(self, after, spool_id, max_items):
        return self.client.traffic_page(after, spool_id, max_items, worker=self.url)


class FleetTrafficReader:
    """Pages through the spool of every worker of ``client`` (a FleetClient with the admin key).

    Args:
        cursors: worker URL -> :class:`Cursor`, updated in place (a worker without one starts a new cursor).
        counts, holdout_every, vocab_size, max_items, max_item_tokens: as :class:`TrafficReader`.
    """

    def __init__(self, client, cursors: Dict[str, Cursor], counts: ReaderCounts, *, holdout_every: int,
                 vocab_size: int, max_items: int = 64, max_item_tokens: int = 4096):
        self.client, self.cursors, self.counts = client, cursors, counts
        self.readers = {url: TrafficReader(_WorkerPages(client, url), cursors.setdefault(url, Cursor()), counts,
                                           holdout_every=holdout_every, vocab_size=vocab_size, max_items=max_items,
                                           max_item_tokens=max_item_tokens)
                        for url in client.worker_urls}

    @property
    def backlog(self) -> int:
        """Items the workers held after their cursors at the last read, summed."""
        return sum(r.backlog for r in self.readers.values())

    def read(self) -> List[ServedItem]:
        """One page of every worker: the valid items, oldest first, each with its ``worker``; advances each
        worker's cursor past what it read."""
        out: List[ServedItem] = []
        for url, reader in self.readers.items():
            try:
                items = reader.read()
            except ServerUnavailableError:
                self.counts.unavailable += 1
                reader.backlog = 0
                continue
            self.counts.by_worker[url] = self.counts.by_worker.get(url, 0) + len(items)
            out += [replace(it, worker=url) for it in items]
        return sorted(out, key=lambda it: it.finished_at)

    def skip_to_newest(self) -> None:
        """Every worker's cursor past what its spool holds now."""
        for reader in self.readers.values():
            reader.skip_to_newest()


def reader_for(client, state, cfg, vocab_size: int):
    """The adapter's reader: a :class:`FleetTrafficReader` over ``state.cursors`` for a fleet client (one with
    ``worker_urls``), else a :class:`TrafficReader` over ``state.cursor``."""
    kw = dict(holdout_every=cfg.holdout_every, vocab_size=vocab_size, max_items=cfg.read_items,
              max_item_tokens=cfg.max_item_tokens)
    if getattr(client, "worker_urls", None) is not None:
        return FleetTrafficReader(client, state.cursors, state.reader, **kw)
    return TrafficReader(client, state.cursor, state.reader, **kw)
