"""The persisted state of a ``specopd adapt`` run: counters, cursor, deploy history (JSON-able), and its checkpoint.

One checkpoint (:func:`specopd_trainer.checkpoint.save_checkpoint`: temp file, fsync, rename; ``latest`` pointer)
holds the candidate drafter, the optimiser, the deployed drafter's weights and the one before it (for a rollback),
and :class:`AdaptState`. The traffic buffers persist themselves (:mod:`.buffer`), so a process killed at any point
resumes from the last checkpoint with every item it had read (items read after that checkpoint are read again from
the older cursor and recognised by key).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from specopd_trainer.adapt.reader import Cursor, ReaderCounts


@dataclass
class AdaptState:
    """Everything but tensors. ``cursor``: where the next spool read starts (one server); ``cursors``: the same per
    worker URL (a fleet). ``deployed``: versions the adapter put into the server, in order
    ``{"version", "step", "t_s", "why"}`` (the first is the server's own at start); ``verdicts``: the last few
    comparisons (:class:`specopd_trainer.adapt.guard.Verdict` dicts with ``step`` and ``kind``)."""

    step: int = 0
    wall_s: float = 0.0
    cursor: Cursor = field(default_factory=Cursor)
    cursors: Dict[str, Cursor] = field(default_factory=dict)  # a fleet: one cursor per worker URL
    reader: ReaderCounts = field(default_factory=ReaderCounts)
    features: Dict[str, int] = field(default_factory=dict)
    deployed: List[Dict[str, Any]] = field(default_factory=list)
    pushes: int = 0
    rollbacks: int = 0
    push_errors: int = 0
    candidate_resets: int = 0
    trained_tokens: int = 0  # supervised draft positions
    traffic_tokens_seen: int = 0  # served tokens (prompt + response) of every valid item read
    traffic_tokens_trained: int = 0  # served response tokens of the items that entered the training buffer
    evaluations: int = 0
    verdicts: List[Dict[str, Any]] = field(default_factory=list)
    timings_s: Dict[str, float] = field(default_factory=dict)  # ingest / train / judge / wait seconds, resumes included
    slice_header: Optional[List[int]] = None  # the header slices are keyed after (frozen at the first page read)
    slice_seen: Dict[str, int] = field(default_factory=dict)  # slice key -> requests seen (adapt.slices)
    # guard verdicts by "kind:outcome" (deploy | hold) and the Unix time of the last one (``--metrics-port``)
    verdict_counts: Dict[str, int] = field(default_factory=dict)
    last_verdict_unix: Optional[float] = None
    schedule: Dict[str, Any] = field(default_factory=dict)  # --algorithm auto: its phase and choice (adapt.auto)

    def time(self, what: str, seconds: float) -> None:
        self.timings_s[what] = round(self.timings_s.get(what, 0.0) + seconds, 3)

    @property
    def deployed_version(self) -> Optional[str]:
        return self.deployed[-1]["version"] if self.deployed else None

    def note_verdict(self, verdict: Dict[str, Any], keep: int = 20) -> None:
        self.verdicts = (self.verdicts + [verdict])[-keep:]
        if "deploy" in verdict:  # a guard comparison (candidate, deployed_vs_previous), not a reset or push error
            key = f"{verdict.get('kind')}:{'deploy' if verdict['deploy'] else 'hold'}"
            self.verdict_counts[key] = self.verdict_counts.get(key, 0) + 1
            self.last_verdict_unix = time.time()

    def as_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["cursor"], out["reader"] = self.cursor.as_dict(), asdict(self.reader)
        out["cursors"] = {url: c.as_dict() for url, c in self.cursors.items()}
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "AdaptState":
        d = dict(d)
        cursor, reader = Cursor(**d.pop("cursor")), ReaderCounts(**d.pop("reader"))
        cursors = {url: Cursor(**c) for url, c in (d.pop("cursors", None) or {}).items()}
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(cursor=cursor, cursors=cursors, reader=reader, **known)
