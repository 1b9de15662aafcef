"""benchmarks/server_start/run.py: the fork-vs-spawn start-time summary (no server here)."""

from __future__ import annotations

import pytest
from _scripts import load_benchmark


def test_summary_pairs_rounds_and_checks_the_replies() -> None:
    mod = load_benchmark("server_start")
    rounds = [{"spawn": {"healthy_s": 80.0, "output_ids": [1, 2], "forked": False},
               "fork": {"healthy_s": 40.0, "output_ids": [1, 2], "forked": True}},
              {"spawn": {"healthy_s": 60.0, "output_ids": [1, 2], "forked": False},
               "fork": {"healthy_s": 50.0, "output_ids": [1, 2], "forked": True}}]
    s = mod.summarize(rounds)
    assert s["healthy_s_mean"] == {"spawn": 70.0, "fork": 45.0}
    assert s["fork_over_spawn"] == pytest.approx(45.0 / 70.0, abs=1e-4)
    lo, hi = s["fork_over_spawn_ci95"]  # resampled rounds: 40/80, 50/60 or the pooled 90/140
    assert 0.5 <= lo <= 45 / 70 <= hi <= 50 / 60 + 1e-9
    assert s["greedy_identical"] is True and s["forked"] == {"spawn": [False, False], "fork": [True, True]}
    rounds[1]["fork"]["output_ids"] = [1, 3]
    assert mod.summarize(rounds)["greedy_identical"] is False
    assert mod.ratio_ci([1.0], [2.0]) is None


def test_bad_rounds_fail_before_a_server_starts() -> None:
    mod = load_benchmark("server_start")
    with pytest.raises(SystemExit):
        mod.main(["--rounds", "0"])
