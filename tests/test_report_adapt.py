"""The report's items and headline rows for the main job and the traffic-shift benchmark: each headline value appears
in its file's summary item, arms not run are named, and nothing is printed for a file without numbers."""

from __future__ import annotations


def _diff(mean, lo, hi, n=48):
    return {"mean": mean, "ci95": [lo, hi], "prompts": {"japanese": n // 2, "wordsort": n - n // 2},
            "inside_noise": lo <= 0 <= hi}


def test_items_and_headline_rows_agree():
    from sglang_specopd.app.bench.report.adapt import headline, main_job_item, traffic_shift_item

    mj = {"wall_s": 900.0, "new_domains": ["japanese", "wordsort"], "old_domains": ["coding"],
          "traffic": {"old_minutes": 2, "minutes": 8, "requests": 120, "errors_5xx": 0},
          "before": {"new": {"mean": 1.1, "ci95": [1.0, 1.2]}, "old": {"mean": 1.8, "ci95": [1.7, 1.9]}},
          "after": {"new": {"mean": 1.9, "ci95": [1.6, 2.2]}, "old": {"mean": 1.79, "ci95": [1.7, 1.9]}},
          "paired_change": {"new": _diff(0.8, 0.5, 1.1), "old": _diff(-0.01, -0.03, 0.01, 24)},
          "deployed": "adapted", "reason": "candidate interval [+0.2, +0.4] above +0.000"}
    ts = {"shift_minutes": 30, "old_minutes": 3, "new_domains": {"japanese": "a", "wordsort": "b"},
          "arms": {"static": {"final": {"new": {"T0": {"mean": 1.1, "ci95": [1.0, 1.2]}},
                                        "old": {"T0": {"mean": 1.8, "ci95": [1.7, 1.9]}}}},
                   "sft_from_traffic": {"final": {"new": {"T0": {"mean": 2.0, "ci95": [1.8, 2.2]}},
                                                  "old": {"T0": {"mean": 1.8, "ci95": [1.7, 1.9]}}}, "pushes": 3}},
          "paired_diff_vs_static": {"sft_from_traffic": {"new": _diff(0.9, 0.7, 1.1), "old": _diff(0.0, -0.02, 0.02)}},
          "itl_p99_s": {"no_adapter": 0.2, "adapter": 0.25}, "errors_5xx": 0, "arms_not_run": ["specopd"],
          "feature_cost": {"serving_overhead_fraction": 0.012, "train_tokens_per_s_with": 5000,
                           "train_tokens_per_s_without": 400}}
    results = {"main_job_smollm2_cpu.json": mj, "traffic_shift_smollm2_cpu.json": ts}
    items = {"main_job_smollm2_cpu.json": main_job_item("main_job_smollm2_cpu.json", mj)[0],
             "traffic_shift_smollm2_cpu.json": traffic_shift_item("traffic_shift_smollm2_cpu.json", ts)[0]}
    rows = headline(results)
    assert [r[2] for r in rows] == ["traffic_shift_smollm2_cpu.json", "main_job_smollm2_cpu.json"]
    for what, value, name in rows:
        for part in value.split(" / "):
            assert part in items[name], (part, items[name])
    assert rows[0][1] == "+0.900 [+0.700, +1.100] (48 prompts) / +0.000 [-0.020, +0.020] (48 prompts, inside the noise)"
    assert "arms not run: specopd" in items["traffic_shift_smollm2_cpu.json"]
    assert "1.2% of serving throughput" in items["traffic_shift_smollm2_cpu.json"]
    assert "deployed: adapted (candidate interval" in items["main_job_smollm2_cpu.json"]
    assert main_job_item("x", {}) == [] and traffic_shift_item("x", {}) == [] and headline({}) == []


def test_main_job_summary_has_every_domains_change_with_its_interval():
    from pathlib import Path

    from sglang_specopd.app.main_job.run import MainJobConfig
    from sglang_specopd.app.main_job.report import change_line, summary

    def result(domains, extra):
        rows = [{"id": f"{d}{i}", "domain": d, "completion_tokens": 10 + (extra if i % 2 else 0) + i % 3,
                 "verify_steps": 8} for d in domains for i in range(12)]
        return {"per_request": rows, "per_domain": {d: {"verify_steps": 96} for d in domains}}

    new, old = ("japanese", "wordsort"), ("dialogue", "coding", "math", "agentic")
    before = {"new": result(new, 0), "old": result(old, 0)}
    after = {"new": result(new, 4), "old": result(old, 0)}
    adapted = {"pushes": 0, "deployed_version": "initial", "verdicts": [],
               "deployed": [{"version": "initial", "step": 0, "t_s": 0.0, "why": "serving at start"}],
               **{k: 0 for k in ("step", "rollbacks", "push_errors", "candidate_resets", "traffic_tokens_seen",
                                 "traffic_tokens_trained", "trained_tokens", "train_items", "holdout_items")},
               "reader": {}, "features": {}, "timings_s": {}, "stopped_by": "max_steps"}
    res = summary(MainJobConfig(), before=before, after=after, adapted=adapted, served=[],
                  serving={"version": "initial"}, chat={}, saved=None, timings={}, run_dir=Path("r"),
                  start_drafter=None)
    for group, domains in (("new", new), ("old", old)):
        by = res["paired_change"][group]["by_domain"]
        assert set(by) == set(domains) and all(set(by[d]) >= {"mean", "ci95"} and len(by[d]["ci95"]) == 2
                                               for d in domains)
    assert res["paired_change"]["new"]["by_domain"]["japanese"]["mean"] > 0
    assert res["paired_change"]["old"]["by_domain"]["coding"]["ci95"] == [0.0, 0.0]
    assert MainJobConfig().eval_old >= 12  # >= 12 prompts per old domain
    assert "japanese" in change_line("new domains", res["paired_change"]["new"])
