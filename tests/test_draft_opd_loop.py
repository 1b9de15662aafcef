"""The Draft-OPD loop on the shared engine against a fake server: steps, pushes and the version ledger, metrics,
exact resume, stale records dropped, the traffic source, and the ablation switches (no replay, one KL direction,
random anchors)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from _sft_fixture import tiny_drafter
from fakes.draft_opd import G, PROMPTS, FakeServer
from fakes.draft_opd import draft_opd_config as _cfg
from fakes.draft_opd import pusher as _pusher


def _rows(run: Path):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_two_steps_metrics_pushes_and_exact_resume(tmp_path: Path) -> None:
    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    whole, server, pushes = tiny_drafter(), FakeServer(), []
    summary = train_draft_opd(whole, server, PROMPTS, tmp_path / "whole", _cfg(), push=_pusher(server, pushes),
                              progress=False)
    assert summary["steps"] == 4 and pushes == [0, 2, 4] and summary["pushed"] == [0, 2, 4]
    assert summary["versions"] == ["init", "draftopd-run-step0", "draftopd-run-step2", "draftopd-run-step4"]
    assert server.score_calls == 4 and server.generated == 8  # one score_trees call per step, 2 rollouts each
    rows = _rows(tmp_path / "whole")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    total = 0
    for r in rows:
        assert r["blocks"] > 0 and r["rejected_tokens"] > 0 and r["error_records"] >= r["blocks"]
        assert r["step_supervised_tokens"] == r["accepted_tokens"] + r["rejected_tokens"]
        assert len(r["accepted_per_slot"]) == G and len(r["rejected_per_slot"]) == G
        assert all(a + b == r["records"] for a, b in zip(r["accepted_per_slot"], r["rejected_per_slot"]))
        assert 1.0 <= r["rollout_tau"] <= G + 1 and 1.0 <= r["est_tau"] <= G + 1
        assert r["stale_records"] == 0 and r["unknown_version_records"] == 0
        total += r["step_supervised_tokens"]
        assert r["supervised_tokens"] == total and r["supervised_tokens_per_s"] > 0
    assert not torch.equal(whole.fc.weight, tiny_drafter().fc.weight)

    # 2 steps (checkpoint at 2, end push at 2), then resumed to 4: the uninterrupted run's drafter and rows
    part_server, part_pushes = FakeServer(), []
    train_draft_opd(tiny_drafter(), part_server, PROMPTS, tmp_path / "split", _cfg(steps=2),
                    push=_pusher(part_server, part_pushes), progress=False)
    assert part_pushes == [0, 2]
    resumed = tiny_drafter()
    out = train_draft_opd(resumed, part_server, PROMPTS, tmp_path / "split", _cfg(),
                          push=_pusher(part_server, part_pushes), progress=False)
    assert out["start_step"] == 2 and out["pushed"] == [2, 4] and out["versions"] == summary["versions"]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    same = ("step", "loss", "blocks", "accepted_tokens", "rejected_tokens", "supervised_tokens", "est_tau")
    assert [{k: r[k] for k in same} for r in _rows(tmp_path / "split")] == [{k: r[k] for k in same} for r in rows]


def test_stale_records_are_dropped_in_the_loop(tmp_path: Path) -> None:
    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    server = FakeServer(stale_first=True)  # every request's first record comes from an unknown old drafter
    train_draft_opd(tiny_drafter(), server, PROMPTS, tmp_path / "r", _cfg(steps=1), push=_pusher(server, []),
                    progress=False)
    (row,) = _rows(tmp_path / "r")
    assert row["unknown_version_records"] == 2 and row["stale_records"] == 0
    kept = train_draft_opd(tiny_drafter(), FakeServer(stale_first=True), PROMPTS, tmp_path / "k",
                           _cfg(steps=1, keep_unknown_versions=True), push=_pusher(FakeServer(), []), progress=False)
    assert kept["metrics"]["unknown_version_records"] == 0
    assert kept["metrics"]["records"] == row["records"] + 2


def test_traffic_mode_trains_on_recorded_requests(tmp_path: Path) -> None:
    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    server, pushes = FakeServer(), []
    push = _pusher(server, pushes)

    def record_traffic():  # what clients sent, served by the drafter pushed just before
        for p in PROMPTS:
            out = server.generate(p, max_new_tokens=10)
            server.spool.append({"input_ids": p + out["output_ids"], "prompt_len": len(p),
                                 "trace": out["meta_info"]["specopd_trace"]})

    record_traffic()  # served by "init" before the run started
    summary = train_draft_opd(tiny_drafter(), server, [], tmp_path / "t",
                              _cfg(steps=1, from_traffic=True, push_every=0, purge_traffic=True), push=push, progress=False)
    assert server.purged == 1 and summary["metrics"]["records"] > 0 and pushes == [1]
    # the ledger knows "init" (the serving version when the run began): traffic served by it is fresh
    assert summary["metrics"]["stale_records"] == 0 and summary["metrics"]["unknown_version_records"] == 0

    # no traffic at all: the step waits (polls) and gives up after traffic_wait_s
    waits = []
    with pytest.raises(ValueError, match="no usable traffic"):
        train_draft_opd(tiny_drafter(), FakeServer(), [], tmp_path / "empty",
                        _cfg(steps=1, from_traffic=True, traffic_wait_s=1e-3), push=_pusher(FakeServer(), []),
                        progress=False, sleep=waits.append)


class CursorSpool(FakeServer):
    """A spool read with a cursor and not purged, like the real client: oldest first, ``max_items`` per read, and
    ``last_traffic`` says how many items wait after the cursor."""

    def __init__(self):
        super().__init__()
        self.cursor, self.reads = 0, 0

    def traffic(self, max_items):
        self.reads += 1
        items = self.spool[self.cursor:self.cursor + max_items]
        self.cursor += len(items)
        self.last_traffic = SimpleNamespace(next_after=self.cursor, stats=SimpleNamespace(newest_seq=len(self.spool)))
        return items


def test_traffic_backlog_of_stale_records_is_read_through_without_waiting(tmp_path: Path) -> None:
    """CI regression: on a busy server the traffic recorded during a step (by the drafter pushed before it) piles
    up; after the next push it is all stale. One read of ``traffic_items`` per poll interval never caught up with
    the new traffic ("no usable traffic within 60 s", 6,476 stale records dropped). Now the reader reads on at
    once while there is a backlog and waits only when it has read everything."""
    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    server = CursorSpool()

    def record(n, version):
        old, server.version = server.version, version
        for i in range(n):
            p = PROMPTS[i % len(PROMPTS)]
            out = server.generate(p, max_new_tokens=10)
            server.spool.append({"input_ids": p + out["output_ids"], "prompt_len": len(p),
                                 "trace": out["meta_info"]["specopd_trace"]})
        server.version = old

    def push(step, drafter):  # the run's push at step 0: 40 requests by the previous drafter are still unread
        server.version = f"draftopd-run-step{step}"
        record(40, "init")
        record(3, server.version)
        return server.version

    waits = []
    summary = train_draft_opd(tiny_drafter(), server, [], tmp_path / "t",
                              _cfg(steps=1, from_traffic=True, push_every=1, traffic_items=4, max_staleness=0,
                                   traffic_wait_s=600), push=push, progress=False, sleep=waits.append)
    m = summary["metrics"]
    assert waits == [] and server.reads == 11  # 40 stale items in 10 reads of 4, then the fresh ones
    assert m["stale_records"] == sum(len(it["trace"]) for it in server.spool[:40]) and m["records"] > 0

    # with nothing unread left the reader waits for new traffic (one poll interval after each empty read but the
    # last, which ends at the deadline)
    server2 = CursorSpool()
    with pytest.raises(ValueError, match="no usable traffic"):
        train_draft_opd(tiny_drafter(), server2, [], tmp_path / "empty",
                        _cfg(steps=1, from_traffic=True, push_every=0, traffic_wait_s=1e-3), push=_pusher(server2, []),
                        progress=False, sleep=waits.append)
    assert server2.reads >= 2 and waits == [2.0] * (server2.reads - 1)


@pytest.mark.parametrize("options", [{"replay": False}, {"loss": "fkl_only"}, {"loss": "rkl_only"},
                                     {"anchors": "random"}, {"rejected_slots": "first"}])
def test_ablations_run_and_differ_from_the_method(tmp_path: Path, options) -> None:
    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    def one(name, **kw):
        server = FakeServer()
        out = train_draft_opd(tiny_drafter(), server, PROMPTS, tmp_path / name, _cfg(steps=1, **kw),
                              push=_pusher(server, []), progress=False)
        return out, server

    base, _ = one("base")
    abl, server = one("ablation", **options)
    assert abl["loss"] == abl["loss"] and abl["loss"] != pytest.approx(base["loss"], rel=1e-6)
    if options.get("replay") is False:  # SFT on the rollout text: features only, no drafted tokens scored
        assert server.score_calls == 1 and "rejected_tokens" not in abl["metrics"]
        assert abl["metrics"]["step_supervised_tokens"] > 0
    if options.get("rejected_slots") == "first":  # same blocks scored; only the first rejected slot of each
        m, b = abl["metrics"], base["metrics"]
        assert (m["blocks"], m["accepted_tokens"], m["step_scored_tokens"]) == \
            (b["blocks"], b["accepted_tokens"], b["step_scored_tokens"])
        assert m["rejected_tokens"] == m["blocks"] < b["rejected_tokens"]  # error anchors: one first rejection each
        assert m["step_supervised_tokens"] == m["accepted_tokens"] + m["blocks"] < m["step_scored_tokens"]
