"""Committable response snapshots (trainer/specopd_trainer/data/snapshot.py): shards round-trip a response cache,
are append-only, skip responses whose prompt changed, and refuse corrupt shards with a typed error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from specopd_trainer.collect import iter_responses
from specopd_trainer.data.snapshot import (SnapshotError, import_snapshot, iter_snapshot, prompt_sha256,
                                           write_shard)


def _render(rec) -> list:
    """A stand-in chat template: one token per character of the user message, plus a role marker."""
    return [7] + [ord(c) for c in rec["messages"][0]["content"]]


def _records(n: int) -> dict:
    return {f"p{i}": {"id": f"p{i}", "domain": "math", "messages": [{"role": "user", "content": f"q{i}?"}]}
            for i in range(n)}


def _write_cache(path: Path, records: dict, ids) -> None:
    with open(path, "a") as fh:
        for i in ids:
            rec = records[i]
            fh.write(json.dumps({"id": i, "domain": rec["domain"], "prompt_ids": _render(rec),
                                 "response_ids": [len(i), 5, 6], "finish_reason": "stop"}) + "\n")


def test_prompt_sha256_is_order_sensitive():
    assert prompt_sha256([1, 2]) != prompt_sha256([2, 1])
    assert prompt_sha256([1, 23]) != prompt_sha256([12, 3])
    assert prompt_sha256((1, 2)) == prompt_sha256([1, 2])


def test_shards_roundtrip_and_are_append_only(tmp_path):
    recs = _records(5)
    cache, snap = tmp_path / "a" / "responses.jsonl", tmp_path / "snap"
    cache.parent.mkdir()
    _write_cache(cache, recs, ["p0", "p1", "p2"])
    first = write_shard(cache, snap)
    assert first.name == "responses-000.jsonl.gz"
    assert write_shard(cache, snap) is None  # nothing new
    _write_cache(cache, recs, ["p3"])
    second = write_shard(cache, snap)
    assert second.name == "responses-001.jsonl.gz"
    assert [r["id"] for r in iter_snapshot(snap)] == ["p0", "p1", "p2", "p3"]
    assert [json.loads(line)["id"] for line in gzip.open(second, "rt")] == ["p3"]
    # same records, same bytes (gzip mtime 0): a re-snapshot on another machine gives a clean diff
    again = tmp_path / "snap2"
    write_shard(cache, again)
    third = tmp_path / "snap3"
    write_shard(cache, third)
    assert (again / "responses-000.jsonl.gz").read_bytes() == (third / "responses-000.jsonl.gz").read_bytes()

    # a fresh machine: an empty cache, one response already there
    fresh = tmp_path / "b" / "responses.jsonl"
    fresh.parent.mkdir()
    _write_cache(fresh, recs, ["p2"])
    got = import_snapshot(snap, fresh, recs, _render)
    assert (got.added, got.present, got.unknown, got.changed) == (3, 1, 0, 0)
    by_id = {r.id: r for r in iter_responses(fresh)}
    assert sorted(by_id) == ["p0", "p1", "p2", "p3"]
    assert by_id["p3"].prompt_ids == tuple(_render(recs["p3"]))
    assert by_id["p3"].response_ids == (2, 5, 6)
    assert by_id["p0"].finish_reason == "stop"
    # importing twice adds nothing
    assert import_snapshot(snap, fresh, recs, _render).added == 0


def test_import_skips_unknown_ids_and_changed_prompts(tmp_path):
    recs = _records(3)
    cache, snap = tmp_path / "responses.jsonl", tmp_path / "snap"
    _write_cache(cache, recs, ["p0", "p1", "p2"])
    write_shard(cache, snap)
    now = {k: v for k, v in recs.items() if k != "p0"}  # p0 left the corpus
    now["p1"] = {**recs["p1"], "messages": [{"role": "user", "content": "edited"}]}  # p1's prompt changed
    out = tmp_path / "fresh.jsonl"
    got = import_snapshot(snap, out, now, _render)
    assert (got.added, got.present, got.unknown, got.changed) == (1, 0, 1, 1)
    assert [r.id for r in iter_responses(out)] == ["p2"]


# gzip with mtime=0 and explicit ids: a collection-time timestamp in a parameter made the two xdist workers collect
# different test ids across a second boundary
@pytest.mark.parametrize("payload", [b"not gzip at all", gzip.compress(b"{not json}\n", mtime=0),
                                     gzip.compress(b'{"id": "x", "domain": "math"}\n', mtime=0)],
                         ids=["not-gzip", "not-json", "missing-fields"])
def test_corrupt_shard_raises_typed_error(tmp_path, payload):
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "responses-000.jsonl.gz").write_bytes(payload)
    with pytest.raises(SnapshotError):
        list(iter_snapshot(snap))
