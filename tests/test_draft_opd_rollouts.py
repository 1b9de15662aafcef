"""Draft-OPD's rollout side without a server: verify records (first rejected slot, drafter version), the
staleness ledger (stale and unknown-version records dropped, resume), error- vs random-anchor selection, and the
traffic source against a fake client."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specopd_trainer.algorithms.draft_opd.replay import rollout_stats, select_blocks
from specopd_trainer.algorithms.draft_opd.rollouts import TracedRollout, traffic_source, verify_records
from specopd_trainer.algorithms.draft_opd.versions import VersionLedger, drop_stale

B = 4  # block size: G = 3 drafted slots


def _rec(anchor, accepted, version="v", proposed=(5, 6, 7)):
    return {"anchor": anchor, "proposed": list(proposed), "accepted": accepted, "drafter_version": version}


def test_verify_records_first_rejected_slot_and_versions() -> None:
    trace = [_rec(3, 0), _rec(4, 2), _rec(7, 3), {"anchor": 11, "proposed": [1, 2, 3], "accepted": 1},
             {"anchor": 13, "proposed": [1, 2, 3], "accepted": 4}]  # the last is malformed
    recs = verify_records(trace, B, request_versions=["only"])
    assert [(r.anchor, r.accepted, r.first_rejected) for r in recs] == [(3, 0, 1), (4, 2, 3), (7, 3, None), (11, 1, 2)]
    assert [r.drafter_version for r in recs] == ["v", "v", "v", "only"]  # no version of its own: the request's
    # a request served by two versions: a record without its own version stays unknown
    assert verify_records(trace[3:4], B, request_versions=["a", "b"])[0].drafter_version is None


def test_stale_and_unknown_records_are_dropped(tmp_path: Path) -> None:
    ledger = VersionLedger(tmp_path, 0)
    for step, v in ((-1, "init"), (0, "x-step0"), (2, "x-step2"), (4, "x-step4")):
        ledger.note(step, v)
    ledger.note(5, "x-step4")  # the same version again is not a push
    assert ledger.versions == ["init", "x-step0", "x-step2", "x-step4"]
    assert [ledger.staleness(v) for v in ("x-step4", "x-step2", "x-step0", "init", "other", None)] == \
        [0, 1, 2, 3, None, None]
    recs = verify_records([_rec(i, 0, v) for i, v in enumerate(["x-step4", "x-step2", "x-step0", "init", "other"])]
                          + [{"anchor": 9, "proposed": [1, 2, 3], "accepted": 0}], B)
    roll = [TracedRollout(list(range(20)), 2, recs)]
    kept, counts = drop_stale(roll, ledger, max_staleness=1)
    assert [x.drafter_version for x in kept[0].records] == ["x-step4", "x-step2"]
    assert counts == {"stale_records": 2, "unknown_version_records": 2}
    kept, counts = drop_stale(roll, ledger, max_staleness=0, keep_unknown=True)
    assert [x.drafter_version for x in kept[0].records] == ["x-step4", "other", None]
    assert counts == {"stale_records": 3, "unknown_version_records": 0}
    kept, counts = drop_stale(roll, ledger, max_staleness=None)
    assert len(kept[0].records) == 6 and counts == {"stale_records": 0, "unknown_version_records": 0}
    # persisted; a run resuming from the checkpoint of step 2 keeps the versions served before it
    assert VersionLedger(tmp_path, 10).versions == ledger.versions
    assert VersionLedger(tmp_path, 2).versions == ["init", "x-step0"]


def _rollouts():
    # accepted counts per record; G = 3, so accepted < 3 is an error block (it has a rejected slot)
    accs = [[0, 3, 1, 3], [3, 3, 2], [3]]
    return [TracedRollout(list(range(40)), 2, verify_records([_rec(2 + 4 * j, a) for j, a in enumerate(row)], B))
            for row in accs]


def test_error_anchors_select_the_blocks_with_a_rejection() -> None:
    sel = select_blocks(_rollouts(), 3, "error", 100, torch.Generator().manual_seed(0))
    got = [(r.token_ids is not None, [(x.anchor, x.accepted) for x in recs]) for r, recs in sel]
    assert got == [(True, [(2, 0), (10, 1)]), (True, [(10, 2)])]  # rollout 2 has no error block: left out
    capped = select_blocks(_rollouts(), 3, "error", 2, torch.Generator().manual_seed(0))
    assert sum(len(recs) for _, recs in capped) == 2
    # records whose anchor lies outside the rollout are not replayed
    far = [TracedRollout([1, 2, 3], 1, verify_records([_rec(3, 0)], B))]
    assert select_blocks(far, 3, "error", 10, torch.Generator()) == []


def test_random_anchors_draw_as_many_blocks_from_all_records() -> None:
    seen_clean = False
    draws = []
    for seed in range(6):
        sel = select_blocks(_rollouts(), 3, "random", 100, torch.Generator().manual_seed(seed))
        recs = [x for _, r in sel for x in r]
        assert len(recs) == 3  # as many as the error blocks
        seen_clean |= any(x.first_rejected is None for x in recs)
        draws.append([(x.anchor, x.accepted) for x in recs])
    assert seen_clean  # blocks without a rejection are drawn too
    again = select_blocks(_rollouts(), 3, "random", 100, torch.Generator().manual_seed(5))
    assert [(x.anchor, x.accepted) for _, r in again for x in r] == draws[5]  # a pure function of the generator
    with pytest.raises(ValueError, match="anchors must be"):
        select_blocks(_rollouts(), 3, "all", 100, torch.Generator())


def test_rollout_stats_count_accepted_and_rejected_slots() -> None:
    s = rollout_stats(_rollouts(), 3)
    # accepted counts 0, 3, 1, 3, 3, 3, 2, 3: slot 1 accepted by 7, slot 2 by 6, slot 3 by 5
    assert s["records"] == 8 and s["error_records"] == 3
    assert s["accepted_per_slot"] == [7, 6, 5] and s["rejected_per_slot"] == [1, 2, 3]
    assert s["rollout_tau"] == pytest.approx(1 + 18 / 8)


class FakeTrafficClient:
    """Stands in for SpecOPDClient.traffic / purge_traffic (the server's recorded-traffic admin endpoint)."""

    def __init__(self, items):
        self.items, self.calls = list(items), []

    def traffic(self, max_items: int):
        self.calls.append(("traffic", max_items))
        return self.items[:max_items]

    def purge_traffic(self):
        self.calls.append(("purge",))
        self.items = []


def test_traffic_source_reads_items_and_purges() -> None:
    items = [{"input_ids": [1, 2, 3, 4, 5, 6], "prompt_len": 2, "trace": [_rec(1, 1, "a"), _rec(3, 3, "b")]},
             {"input_ids": [], "prompt_len": 0, "trace": []},  # malformed: skipped
             {"input_ids": [7, 8, 9], "prompt_len": 9, "trace": []},  # prompt longer than the sequence: skipped
             {"input_ids": [7, 8, 9, 10], "prompt_len": 3, "trace": [{"anchor": 2, "proposed": [1, 2, 3],
                                                                     "accepted": 0}]}]
    client = FakeTrafficClient(items)
    source = traffic_source(client, block_size=B, max_items=10, purge=True)
    got = source(torch.Generator())
    assert client.calls == [("traffic", 10), ("purge",)]
    assert [(r.token_ids, r.prompt_len) for r in got] == [([1, 2, 3, 4, 5, 6], 2), ([7, 8, 9, 10], 3)]
    assert [(x.anchor, x.first_rejected, x.drafter_version) for x in got[0].records] == [(1, 2, "a"), (3, None, "b")]
    assert got[1].records[0].drafter_version is None  # no version recorded: unknown
    assert source(torch.Generator()) == []  # purged
    keep = FakeTrafficClient(items[:1])
    traffic_source(keep, block_size=B, max_items=1, purge=False)(torch.Generator())
    assert keep.calls == [("traffic", 1)] and keep.items
