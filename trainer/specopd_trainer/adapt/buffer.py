"""Byte-bounded traffic buffers of ``specopd adapt``, in memory and on disk (resume loses nothing that was read).

:class:`TrafficBuffer` holds :class:`TrafficSequence` s (a :class:`specopd_trainer.features.Sequence` plus the
served verify records and the drafter versions that served it) oldest first. Every :meth:`add` writes the new
sequences as one safetensors shard (``shard-<n>.safetensors``: ``ids.<i>`` int32, ``feat.<i>`` bf16, and the
records / keys as JSON metadata) and then ``index.json`` atomically, so a process killed at any point leaves a
loadable buffer (a shard not in the index is ignored and removed at the next open). The byte size of a sequence
is that of its ids and features; when the total passes ``max_bytes`` whole shards are dropped oldest first
(``evicted`` counts their sequences). Keys (``<spool_id>:<seq>``) are unique: a sequence read again after a resume
is not added twice (``duplicates``).

With ``per_slice`` (the held-out and rehearsal buffers) every slice (:mod:`.slices`) keeps at most that many
sequences, its oldest dropped first, and over the byte budget the oldest sequence of the largest slice goes: a slice
that stops arriving keeps its items however much of the new traffic follows (a FIFO window would push it out).
Dropped keys of shards still on disk are listed in the index; a shard with nothing left is deleted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence as Seq, Tuple

import torch

from specopd_trainer.checkpoint import atomic_write_bytes
from specopd_trainer.features import Sequence


@dataclass(frozen=True)
class TrafficSequence(Sequence):
    """A served request as training data: ``id`` is its key, ``domain`` ``"traffic"``; ``records``: its verify
    records as served; ``served_by``: the drafter versions that proposed for it; ``worker``: the fleet worker that
    served it (None: the one server)."""

    records: Tuple[dict, ...] = ()
    served_by: Tuple[str, ...] = ()
    worker: Optional[str] = None
    slice: str = "other"

    @property
    def nbytes(self) -> int:
        return self.token_ids.numel() * 4 + self.features.numel() * self.features.element_size()


class TrafficBuffer:
    """Sequences oldest first under ``max_bytes`` (memory and disk), persisted in ``root``."""

    def __init__(self, root: str | Path, max_bytes: int, per_slice: Optional[int] = None):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.root, self.max_bytes, self.per_slice = Path(root), int(max_bytes), per_slice
        self._dropped: set = set()
        self._shard_keys: Dict[str, set] = {}  # every key written in each shard on disk (dropped ones included)
        self.root.mkdir(parents=True, exist_ok=True)
        self._shards: List[Tuple[str, List[TrafficSequence]]] = []
        self.counts = {"added": 0, "evicted": 0, "duplicates": 0, "dropped_oversize": 0}
        self._next = 0
        self._load()

    # ---- persistence -------------------------------------------------------------------------------------------
    def _index_path(self) -> Path:
        return self.root / "index.json"

    def _write_index(self) -> None:
        data = {"shards": [name for name, _ in self._shards], "next": self._next, "counts": self.counts,
                "dropped": sorted(self._dropped)}
        atomic_write_bytes(self._index_path(), lambda fh: fh.write(json.dumps(data).encode()))

    def _load(self) -> None:
        from safetensors import safe_open

        if not self._index_path().is_file():
            return
        data = json.loads(self._index_path().read_text())
        self._next, self.counts = int(data["next"]), {**self.counts, **data.get("counts", {})}
        self._dropped = set(data.get("dropped", []))
        for name in data["shards"]:
            with safe_open(str(self.root / name), "pt") as fh:
                meta = json.loads(fh.metadata()["sequences"])
                self._shard_keys[name] = {m["key"] for m in meta}
                seqs = [TrafficSequence(id=m["key"], domain="traffic", token_ids=fh.get_tensor(f"ids.{i}").long(),
                                        features=fh.get_tensor(f"feat.{i}"), prompt_len=int(m["prompt_len"]),
                                        records=tuple(m["records"]), served_by=tuple(m["served_by"]),
                                        worker=m.get("worker"), slice=m.get("slice", "other"))
                        for i, m in enumerate(meta) if m["key"] not in self._dropped]
            self._shards.append((name, seqs))
        kept = {name for name, _ in self._shards} | {"index.json"}
        for p in self.root.iterdir():  # shards written after the last index (a kill between the two writes)
            if p.name not in kept and not p.name.startswith("."):
                p.unlink(missing_ok=True)

    # ---- contents ----------------------------------------------------------------------------------------------
    @property
    def sequences(self) -> List[TrafficSequence]:
        """All held sequences, oldest first (a new list)."""
        return [s for _, seqs in self._shards for s in seqs]

    def __len__(self) -> int:
        return sum(len(seqs) for _, seqs in self._shards)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for _, seqs in self._shards for s in seqs)

    def keys(self) -> set:
        return {s.id for _, seqs in self._shards for s in seqs}

    def response_tokens(self) -> int:
        return sum(len(s.token_ids) - s.prompt_len for _, seqs in self._shards for s in seqs)

    def add(self, seqs: Seq[TrafficSequence]) -> int:
        """Append ``seqs`` (not already held, each within ``max_bytes``) as one shard, evict the oldest shards over
        the budget, persist. Returns how many were added."""
        from safetensors.torch import save_file

        known = self.keys() | self._dropped  # a dropped sequence read again (a resume) stays dropped
        fresh = []
        for s in seqs:
            if s.id in known:
                self.counts["duplicates"] += 1
            elif s.nbytes > self.max_bytes:
                self.counts["dropped_oversize"] += 1
            else:
                fresh.append(s)
                known.add(s.id)
        if not fresh:
            return 0
        name = f"shard-{self._next:07d}.safetensors"
        self._next += 1
        tensors: Dict[str, torch.Tensor] = {}
        meta = []
        for i, s in enumerate(fresh):
            tensors[f"ids.{i}"] = s.token_ids.to(torch.int32).contiguous()
            tensors[f"feat.{i}"] = s.features.contiguous()
            meta.append({"key": s.id, "prompt_len": s.prompt_len, "records": list(s.records),
                         "served_by": list(s.served_by), "slice": s.slice,
                         **({"worker": s.worker} if s.worker else {})})
        tmp = self.root / f".{name}.tmp"
        save_file(tensors, str(tmp), metadata={"sequences": json.dumps(meta)})
        os.replace(tmp, self.root / name)
        self._shards.append((name, fresh))
        self._shard_keys[name] = {s.id for s in fresh}
        self.counts["added"] += len(fresh)
        if self.per_slice is not None:
            self._evict_by_slice()
        else:
            total = self.nbytes
            while total > self.max_bytes and len(self._shards) > 1:
                old_name, old = self._shards.pop(0)
                total -= sum(s.nbytes for s in old)
                self.counts["evicted"] += len(old)
        self._write_index()
        for p in self.root.glob("shard-*.safetensors"):
            if p.name not in {n for n, _ in self._shards}:
                p.unlink(missing_ok=True)
        return len(fresh)

    def by_slice(self) -> Dict[str, List[TrafficSequence]]:
        """Held sequences per slice, oldest first."""
        out: Dict[str, List[TrafficSequence]] = {}
        for s in self.sequences:
            out.setdefault(s.slice, []).append(s)
        return out

    def _evict_by_slice(self) -> None:
        """Drop the oldest of every slice over ``per_slice``, then the oldest of the largest slice while over
        ``max_bytes``; empty shards go, the dropped keys of the others are remembered."""
        groups = self.by_slice()
        drop = {s.id for seqs in groups.values() for s in seqs[:max(0, len(seqs) - self.per_slice)]}
        for seqs in groups.values():
            del seqs[:max(0, len(seqs) - self.per_slice)]
        total = sum(s.nbytes for seqs in groups.values() for s in seqs)
        while total > self.max_bytes and sum(len(v) for v in groups.values()) > 1:
            largest = max(groups.values(), key=len)
            gone = largest.pop(0)
            drop.add(gone.id)
            total -= gone.nbytes
        if not drop:
            return
        self.counts["evicted"] += len(drop)
        self._dropped |= drop
        self._shards = [(name, [s for s in seqs if s.id not in drop]) for name, seqs in self._shards]
        self._shards = [(name, seqs) for name, seqs in self._shards if seqs]
        self._shard_keys = {name: self._shard_keys.get(name, set()) for name, _ in self._shards}
        on_disk = set().union(*self._shard_keys.values()) if self._shard_keys else set()
        self._dropped &= on_disk  # keys of deleted shards need no remembering
