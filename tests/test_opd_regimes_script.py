"""``benchmarks/opd_regimes`` without servers: the regimes and arms, wall matching, the result's keys and paired
differences (hand-checkable), and the SFT phase -> snapshot -> arms pipeline against the fake traffic server (the
SFT and T=0-chain arms: frozen buffers, counters, resume skips finished arms)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

from _sft_fixture import tiny_drafter
from fakes.adapt import FakeSpool
from fakes.adapt import run_ids as _run_ids

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def test_regimes_arms_and_wall_matching():
    from opd_regimes.regimes import REGIMES, RegimeError, arm_setup, select, within_wall

    assert [r.name for r in select("a,e")] == ["a_dflash_t0", "e_shift_equal_wall", "e_shift_equal_traffic"]
    assert len(select("all")) == 6 and {r.arch for r in REGIMES} == {"dflash", "dflash2", "dspark"}
    with pytest.raises(RegimeError, match="unknown"):
        select("a,z")
    sizes = {"seqs": 2, "anchors": 4, "branches": 3, "rollout_prompts": 2, "max_blocks": 16}
    alg, opts = arm_setup("specopd", 0.0, sizes)
    assert alg == "specopd" and opts["branches"] == 1 and opts["greedy_branch"] and opts["reference_branch"] == 0.5
    alg, opts = arm_setup("specopd", 1.0, sizes)
    assert opts["temperature"] == 1.0 and opts["branches"] == 3 and opts["loss"] == "e2e_fkl_is"
    assert arm_setup("draft_opd", 1.0, sizes) == ("draft-opd", {"rejected_slots": "first", "rollout_prompts": 2,
                                                                "max_blocks": 16})
    assert arm_setup("t0_chain", 0.0, sizes)[0] == "sft"
    assert within_wall(114.0, 100.0) and within_wall(86.0, 100.0) and not within_wall(116.0, 100.0)
    assert not within_wall(1.0, 0.0)


def _rec(arm, seed, taus, wall=100.0):
    rows = [{"id": f"s{seed}:{d}{i}", "domain": d, "completion_tokens": round(t * 10), "verify_steps": 10}
            for d in ("japanese", "wordsort") for i, t in enumerate(taus)]
    return {"arm": arm, "seed": seed, "wall_s": wall, "drafter_rows": 700, "target_rows": 0 if arm == "sft_continued"
            else 900, "supervised_tokens": 630, "steps": 5, "stopped_by": "max_minutes", "per_request": rows}


def test_result_keys_and_paired_differences():
    from opd_regimes.regimes import REGIMES
    from opd_regimes.result import assemble, regime_entry

    regime = [r for r in REGIMES if r.name == "e_shift_equal_wall"][0]
    base = [1.0, 1.2, 1.4, 1.1]
    recs = {"sft_continued": [_rec("sft_continued", 0, base), _rec("sft_continued", 1, base)],
            "draft_opd": [_rec("draft_opd", 0, [t + 0.2 for t in base], wall=110.0),
                          _rec("draft_opd", 1, [t + 0.2 for t in base], wall=112.0)]}
    e = regime_entry(regime, recs, {"stopped_by": "plateau"}, {})
    assert e["temperature"] == 0.0 and e["arch"] == "dflash"
    d = e["arms"]["draft_opd"]
    assert set(d) >= {"wall_s", "drafter_rows", "target_rows", "supervised_tokens", "acceptance", "paired_diff_vs_sft"}
    assert d["wall_s"] == pytest.approx(111.0) and d["target_rows"] == 900 and d["wall_matched"]
    assert d["paired_diff_vs_sft"]["mean"] == pytest.approx(0.2) and d["paired_diff_vs_sft"]["ci95"] == pytest.approx(
        [0.2, 0.2])
    assert d["acceptance"]["japanese"] == pytest.approx(1.375) and set(d["acceptance"]) >= {"mean", "ci95", "wordsort"}
    assert e["arms"]["sft_continued"]["paired_diff_vs_sft"]["mean"] == pytest.approx(0.0)
    res = assemble({regime.name: e}, {"quick": True}, ["a_dflash_t0"])
    assert list(res["opd_wins"]) == ["e_shift_equal_wall draft_opd"] and res["arms_not_run"] == ["a_dflash_t0"]
    json.dumps(res)


def test_options_quick_settings_and_plot(tmp_path):
    from opd_regimes import run
    from opd_regimes.plot import plot

    s = run.settings_of(run.parse(["--quick", "--arms", "draft_opd,t0_chain"]))
    assert s["seeds"] == [0] and s["arms"] == ["sft_continued", "draft_opd", "t0_chain"] and s["eval_prompts"] == 2
    full = run.settings_of(run.parse([]))
    assert full["seeds"] == [0, 1] and full["eval_prompts"] >= 24 and len(full["arms"]) == 4
    assert run.main(["--regimes", "x"]) == 2
    res = {"regimes": {"r": {"arms": {"sft_continued": {"paired_diff_vs_sft": {"mean": 0, "ci95": [0, 0]}},
                                      "specopd": {"paired_diff_vs_sft": {"mean": 0.1, "ci95": [0.05, 0.2]}}}}}}
    assert plot(res, tmp_path / "p.png").stat().st_size > 1000


class FakeEnv:
    """The regime's server, replaced by the fake spool (traffic already in it) and fixed served-tau rows."""

    def __init__(self):
        self.client = FakeSpool()
        for seq in range(1, 41):
            self.client.add(seq, _run_ids(seq, 40), 8)
        self.pushed = []

    def load_drafter(self):
        return tiny_drafter(seed=0)

    def load_snapshot_drafter(self, snap):
        return tiny_drafter(seed=0)

    def push(self, drafter, version):
        self.pushed.append(version)
        self.client.version = version

    def serving_version(self):
        return self.client.version

    @contextlib.contextmanager
    def load(self, regime, offset, requests=None):
        yield None

    def measure(self, regime, tag):
        return [{"id": f"{tag}p{i}", "domain": d, "completion_tokens": 20 + i, "verify_steps": 10}
                for d in regime.domains for i in range(2)]


def test_snapshot_then_arms_on_frozen_buffers_and_resume(tmp_path):
    from opd_regimes import run
    from opd_regimes.arms import run_arm
    from opd_regimes.plateau import SNAPSHOT_VERSION, sft_snapshot
    from opd_regimes.regimes import REGIMES

    regime = REGIMES[0]
    s = {**run.QUICK, "plateau_max_steps": 4, "plateau_max_minutes": 2.0, "arm_minutes": 0.02, "lr": 1e-2,
         "rehearsal": 0.25, "temperature": 0.0, "min_train_tokens": 64, "start_at": "oldest", "min_holdout": 2, "holdout_window": 4}
    env, lines = FakeEnv(), []
    snap = sft_snapshot(env, regime, s, tmp_path, lines.append)
    plateau = json.loads((snap / "plateau.json").read_text())
    assert plateau["step"] == 4 and plateau["train_items"] > 0 and plateau["holdout_items"] > 0
    assert env.pushed[-1] == SNAPSHOT_VERSION and "snapshot taken" in lines[-1]
    assert sft_snapshot(env, regime, s, tmp_path, lines.append) == snap and "kept" in lines[-1]  # reused
    g = tiny_drafter(seed=0).block_size - 1
    base = run_arm(env, regime, "sft_continued", 0, snap, s, tmp_path / "r", None)
    assert base["steps"] >= 1 and base["supervised_tokens"] == base["steps"] * 2 * 4 * g  # seqs x anchors x G
    assert base["drafter_rows"] >= base["supervised_tokens"] and base["target_rows"] == 0
    pages = env.client.pages
    assert base["per_request"][0]["id"] == "s0:p0"
    t0 = run_arm(env, regime, "t0_chain", 0, snap, s, tmp_path / "r", base["wall_s"])
    assert t0["steps"] >= 1 and t0["supervised_tokens"] == t0["steps"] * 2 * 4 * g
    assert env.pushed[-1] == SNAPSHOT_VERSION  # the snapshot serves again after each arm
    again = run_arm(env, regime, "t0_chain", 0, snap, s, tmp_path / "r", base["wall_s"])
    assert again == t0  # finished: skipped
    assert env.client.pages == pages  # the arms read no spool page: frozen buffers
