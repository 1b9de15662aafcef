"""The adapter's training traffic as every algorithm's adapt step sees it (``AdaptContext.train``), with rehearsal.

Every algorithm draws its requests uniformly by index from ``ctx.train`` (SFT and SpecOPD ``randint``, Draft-OPD
``randperm``). :class:`TrainView` is the training buffer (the recent traffic, oldest first) followed by virtual
rehearsal entries: ``r = round(n * rehearsal / (1 - rehearsal))`` of them for ``n`` recent requests, entry ``j``
being request ``j // S`` (cycled) of slice ``j % S`` of the rehearsal buffer (its ``S`` slices sorted by name). So a
uniform draw takes a rehearsal request with probability ``rehearsal`` -- in every step of every algorithm, without
changing any of them -- spread evenly over the slices ever seen, however small their share of today's traffic.
The rehearsal buffer (``rehearsal_per_slice`` newest requests of every slice, :class:`~.buffer.TrafficBuffer` with
``per_slice``) is fed every training request; it holds the old slices after the training buffer's FIFO has dropped
them.
"""

from __future__ import annotations

from typing import Dict, List


class TrainView:
    """A live sequence over ``adapter._train_view`` (list) and ``adapter._rehearsal_view`` (slice -> list), mixed
    with rehearsal share ``adapter.cfg.rehearsal`` (refreshed after every ingest)."""

    def __init__(self, adapter):
        self._a = adapter

    def _parts(self):
        train: List = self._a._train_view
        reh: Dict[str, List] = {k: v for k, v in (getattr(self._a, "_rehearsal_view", None) or {}).items() if v}
        p = float(getattr(self._a.cfg, "rehearsal", 0.0))
        n = len(train)
        r = round(n * p / (1 - p)) if reh and n and p > 0 else 0
        return train, reh, n, r

    def __len__(self) -> int:
        _, _, n, r = self._parts()
        return n + r

    def __getitem__(self, i):
        train, reh, n, r = self._parts()
        if i < 0:
            i += n + r
        if not 0 <= i < n + r:
            raise IndexError(i)
        if i < n:
            return train[i]
        j = i - n
        names = sorted(reh)
        items = reh[names[j % len(names)]]
        return items[(j // len(names)) % len(items)]

    def __iter__(self):
        return (self[i] for i in range(len(self)))
