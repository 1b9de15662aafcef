"""The adapter's training traffic as every algorithm's adapt step sees it (``AdaptContext.train``)."""

from __future__ import annotations


class TrainView:
    """A live sequence over the adapter's training traffic (refreshed after every ingest)."""

    def __init__(self, adapter):
        self._a = adapter

    def __len__(self) -> int:
        return len(self._a._train_view)

    def __getitem__(self, i):
        return self._a._train_view[i]

    def __iter__(self):
        return iter(self._a._train_view)
