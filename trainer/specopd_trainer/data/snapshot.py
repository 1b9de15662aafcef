"""Compact, committable snapshots of a response cache, so a corpus generated over many sessions survives new machines.

Generating the reference corpus (~1M target tokens) takes hours of a CPU server; the response cache
(``responses.jsonl``, :mod:`specopd_trainer.collect`) lives in a machine-local run directory. A snapshot keeps
what cannot be recomputed cheaply, the target's responses, in append-only gzip shards
``responses-NNN.jsonl.gz`` of records ``{"id", "domain", "response_ids", "finish_reason", "prompt_sha256"}``.
Prompt ids are not stored: they are re-rendered from the prompt records (wheels + chat template) on import and
checked against ``prompt_sha256``, so a snapshot never feeds a response to a prompt that changed.

Shards are written once (atomically) and never rewritten; each :func:`write_shard` call adds the records not yet
in any shard. :func:`import_snapshot` appends the snapshot's records missing from a cache.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from specopd_trainer.checkpoint import atomic_write_bytes
from specopd_trainer.collect import iter_responses, repair_cache

__all__ = ["SnapshotError", "ImportCounts", "prompt_sha256", "iter_snapshot", "snapshot_ids", "write_shard",
           "import_snapshot"]

SHARD_GLOB = "responses-*.jsonl.gz"


class SnapshotError(ValueError):
    """A shard that is not a valid snapshot (bad gzip, bad JSON or a record without the required keys)."""


def prompt_sha256(prompt_ids: Sequence[int]) -> str:
    """Hex SHA-256 of the prompt's token ids (comma-joined decimal), the key a response is bound to."""
    return hashlib.sha256(",".join(str(int(t)) for t in prompt_ids).encode()).hexdigest()


def _shards(snap_dir: Path) -> List[Path]:
    return sorted(Path(snap_dir).glob(SHARD_GLOB))


def iter_snapshot(snap_dir: str | os.PathLike[str]) -> Iterator[dict]:
    """Records of every shard in ``snap_dir`` (shard order, then file order); a missing directory yields nothing.

    Raises: SnapshotError on an unreadable shard or a record missing ``id`` / ``domain`` / ``response_ids`` /
    ``prompt_sha256``."""
    for shard in _shards(Path(snap_dir)):
        try:
            with gzip.open(shard, "rt", encoding="utf-8") as fh:
                for no, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    rec = json.loads(line)
                    if not (isinstance(rec, dict) and isinstance(rec.get("id"), str)
                            and isinstance(rec.get("domain"), str) and isinstance(rec.get("response_ids"), list)
                            and isinstance(rec.get("prompt_sha256"), str)):
                        raise SnapshotError(f"{shard}:{no}: not a snapshot record")
                    yield rec
        except (OSError, EOFError, json.JSONDecodeError) as exc:
            raise SnapshotError(f"{shard}: unreadable snapshot shard ({exc})") from None


def snapshot_ids(snap_dir: str | os.PathLike[str]) -> set:
    """Ids of all records in the snapshot."""
    return {r["id"] for r in iter_snapshot(snap_dir)}


def write_shard(cache_path: str | os.PathLike[str], snap_dir: str | os.PathLike[str]) -> Optional[Path]:
    """Write the cache's responses that no shard holds yet as the next shard; returns its path, or None when
    there is nothing new. The shard is written atomically (a crash leaves no partial shard)."""
    snap = Path(snap_dir)
    snap.mkdir(parents=True, exist_ok=True)
    have = snapshot_ids(snap)
    new = [{"id": r.id, "domain": r.domain, "response_ids": list(r.response_ids), "finish_reason": r.finish_reason,
            "prompt_sha256": prompt_sha256(r.prompt_ids)}
           for r in iter_responses(cache_path) if r.id not in have]
    if not new:
        return None
    shards = _shards(snap)
    index = int(shards[-1].name.split("-")[1].split(".")[0]) + 1 if shards else 0
    path = snap / f"responses-{index:03d}.jsonl.gz"
    body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in new).encode()
    # mtime=0: the same records give the same bytes (reviewable diffs, stable hashes)
    atomic_write_bytes(path, lambda fh: fh.write(gzip.compress(body, compresslevel=9, mtime=0)))
    return path


@dataclass(frozen=True)
class ImportCounts:
    """What :func:`import_snapshot` did: ``added`` records appended to the cache, ``present`` already there,
    ``unknown`` whose id is not among the prompt records, ``changed`` whose prompt re-renders to other ids."""

    added: int
    present: int
    unknown: int
    changed: int


def import_snapshot(snap_dir: str | os.PathLike[str], cache_path: str | os.PathLike[str],
                    records: Mapping[str, Mapping], render: Callable[[Mapping], Sequence[int]]) -> ImportCounts:
    """Append the snapshot's responses missing from ``cache_path`` (a responses.jsonl).

    Args:
        records: prompt records by id (``{"id", "domain", "messages", ...}``, e.g. the corpus's).
        render: prompt record -> templated prompt token ids (the chat template, as at collection time).
    Snapshot records whose id is not in ``records`` or whose ``prompt_sha256`` differs from the re-rendered
    prompt are skipped and counted. Raises SnapshotError on a bad shard."""
    path = Path(cache_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_cache(path)
    present_ids = {r.id for r in iter_responses(path)}
    counts: Dict[str, int] = dict(added=0, present=0, unknown=0, changed=0)
    with open(path, "ab") as fh:
        for rec in iter_snapshot(snap_dir):
            rid = rec["id"]
            if rid in present_ids:
                counts["present"] += 1
                continue
            src = records.get(rid)
            if src is None:
                counts["unknown"] += 1
                continue
            prompt = [int(t) for t in render(src)]
            if prompt_sha256(prompt) != rec["prompt_sha256"]:
                counts["changed"] += 1
                continue
            line = {"id": rid, "domain": rec["domain"], "prompt_ids": prompt,
                    "response_ids": [int(t) for t in rec["response_ids"]], "finish_reason": rec.get("finish_reason")}
            fh.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
            present_ids.add(rid)
            counts["added"] += 1
        fh.flush()
        os.fsync(fh.fileno())
    return ImportCounts(**counts)
