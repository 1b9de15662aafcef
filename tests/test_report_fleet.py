"""The report's item and headline row for the fleet benchmark (``fleet_smollm2_cpu.json``): every headline number
appears in the item, and a file without a 2-worker arm gives neither."""

from __future__ import annotations


def _payload():
    level = {(w, c): {"workers": w, "concurrency": c, "output_tokens_per_s": 10.0 * w * (1 + c / 16),
                      "itl_p99_s": 0.1 * c} for w in (1, 2) for c in (1, 16)}
    return {"limit_per_domain": 24, "max_new_tokens": 64, "levels": list(level.values()),
            "scaling": [{"workers": 2, "concurrency": 16, "throughput_ratio": 1.62, "throughput_ratio_ci95": [1.5, 1.7]},
                        {"workers": 2, "concurrency": 1, "throughput_ratio": 0.91,
                         "throughput_ratio_ci95": [0.85, 0.97]}],
            "training": {"workers": {"1": {"supervised_tokens_per_s": 250.0}, "2": {"supervised_tokens_per_s": 390.0}},
                         "ratios": {"2_vs_1": {"supervised_tokens_per_s_ratio": 1.56, "ci95": [1.4, 1.7]}}},
            "rollout": {"rollouts": 5, "committed": 5, "stage_s": 1.8, "commit_s": 0.27, "stale_after_commit": 0,
                        "mixed_version_responses": 0, "errors_5xx": 0},
            "floors": {"levels_errors_5xx": 0, "kill_old_drafter_answers_after_commit": 0,
                       "kill_survivor_on_expected_version": True, "training_kill_lost_steps": [[]]}}


def test_fleet_item_and_headline_agree():
    from sglang_specopd.app.bench.report.fleet import FILE, fleet_headline, fleet_item

    data = _payload()
    item = fleet_item(FILE, data)[0]
    [(what, value, name)] = fleet_headline({FILE: data})
    assert name == FILE and "SpecOPD supervised tokens/s" in what
    assert value == "c=1 0.91x [0.85, 0.97], c=16 1.62x [1.50, 1.70]; 1.56x [1.40, 1.70]"
    for part in ("c=1 0.91x [0.85, 0.97]", "c=16 1.62x [1.50, 1.70]", "1.56x [1.40, 1.70]"):
        assert part in item
    assert "at c=16 20.0 -> 40.0 tokens/s, ITL p99 1.600 -> 1.600 s" in item
    assert "SpecOPD supervised tokens/s 250 -> 390" in item and "5/5 rollouts under load committed" in item
    assert "0 stale or mixed responses after a commit" in item and "kill -9 during training: lost steps 0" in item
    data["scaling"] = [s for s in data["scaling"] if s["workers"] == 3]
    assert fleet_item(FILE, data) == [] and fleet_headline({FILE: data}) == [] and fleet_headline({}) == []


def test_the_headline_takes_the_rerun_when_present():
    from sglang_specopd.app.bench.report.fleet import FILE, FILES, fleet_headline

    rerun = _payload()
    rerun["scaling"] = [s for s in rerun["scaling"] if s["concurrency"] == 16]
    [(what, value, name)] = fleet_headline({FILE: _payload(), FILES[1]: rerun})
    assert name == FILES[1] and value == "c=16 1.62x [1.50, 1.70]; 1.56x [1.40, 1.70]"
