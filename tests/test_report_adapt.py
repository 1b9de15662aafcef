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
    # a verdict that was not judged (no interval) next to one refused by a check that could not run
    adapted["verdicts"] = [{"kind": "candidate", "step": 50, "deploy": False, "ran": False, "requests": 8,
                            "reason": "not judged: 8 held-out requests < 12"},
                           {"kind": "candidate", "step": 150, "deploy": False, "ran": True, "ci95": [0.116, 0.262],
                            "reason": "the older-traffic check (vs the deployed drafter) could not run"}]
    res = summary(MainJobConfig(), before=before, after=after, adapted=adapted, served=[],
                  serving={"version": "initial"}, chat={}, saved=None, timings={}, run_dir=Path("r"),
                  start_drafter=None)
    assert res["deployed"] == "start" and res["reason"] == (
        "no candidate was deployed; the best overall interval [+0.116, +0.262] at step 150 was refused: the "
        "older-traffic check (vs the deployed drafter) could not run")


def test_main_job_rows_name_every_domains_change_and_the_speed():
    from sglang_specopd.app.bench.report.adapt import headline, main_job_item

    by = {"new": {"japanese": {"mean": 0.2, "ci95": [0.1, 0.3]}, "wordsort": {"mean": 1.4, "ci95": [1.0, 1.8]}},
          "old": {"coding": {"mean": -0.071, "ci95": [-0.12, -0.02]}}}
    mj = {"new_domains": ["japanese", "wordsort"], "old_domains": ["coding"],
          "before": {"new": {"mean": 1.1, "ci95": [1.0, 1.2]}, "old": {"mean": 1.8, "ci95": [1.7, 1.9]}},
          "after": {"new": {"mean": 1.9, "ci95": [1.6, 2.2]}, "old": {"mean": 1.79, "ci95": [1.7, 1.9]}},
          "paired_change": {g: {**_diff(0.8, 0.5, 1.1), "by_domain": by[g]} for g in ("new", "old")},
          "speed": {"plain": 30.14, "start": 28.0, "adapted": 36.2,
                    "ratios": {"adapted_over_plain": {"mean": 1.2, "ci95": [1.1, 1.31], "prompts": 24},
                               "start_over_plain": {"mean": 0.93, "ci95": [0.9, 0.96], "prompts": 24}}}}
    item = main_job_item("main_job_smollm2_cpu.json", mj)[0]
    rows = headline({"main_job_smollm2_cpu.json": mj})
    assert [r[0].split(":")[0] for r in rows] == ["Main job (fresh clone)", "Main job", "Main job"]
    per_domain, speed = rows[1][1], rows[2][1]
    assert "per domain" in rows[1][0] and "tokens/s" in rows[2][0]
    assert per_domain == ("japanese +0.200 [+0.100, +0.300], wordsort +1.400 [+1.000, +1.800], "
                          "coding -0.071 [-0.120, -0.020]")
    assert speed == ("plain 30.1 / start 28.0 / adapted 36.2 tokens/s, adapted / plain 1.20x [1.10, 1.31], "
                     "start / plain 0.93x [0.90, 0.96]")
    assert per_domain in item and speed in item
    del mj["speed"]
    assert len(headline({"main_job_smollm2_cpu.json": mj})) == 2 and "speed" not in main_job_item("m", mj)[0]


def test_goodput_rows_one_per_file_and_temperature_agree_with_the_item():
    from sglang_specopd.app.bench.report.goodput import goodput_headline, goodput_item

    def lv(c, t, g, lo, hi, f):
        return {"concurrency": c, "temperature": t, "goodput_over_plain": g, "goodput_over_plain_ci95": [lo, hi],
                "fixed_over_plain": f, "fixed_over_plain_ci95": [f - 0.05, f + 0.05]}

    a = {"counts_as_result": True, "limit_per_domain": 24, "max_new_tokens": 64,
         "levels": [lv(2, 0.0, 1.1, 1.0, 1.2, 1.05), lv(1, 0.0, 1.17, 1.12, 1.21, 1.15), lv(1, 1.0, 0.99, 0.97, 1.01, 0.9)],
         "k0_step_over_plain_step": {"1": 1.01, "2": 0.99}}
    small = {**a, "counts_as_result": False}
    rows = goodput_headline({"goodput_smollm2_epyc-avx2-fp32.json": a, "goodput_smollm2_x.json": small, "other.json": a})
    assert [(r[1], r[2]) for r in rows] == [("1.17x [1.12, 1.21] / 1.10x [1.00, 1.20]",
                                             "goodput_smollm2_epyc-avx2-fp32.json"),
                                            ("0.99x [0.97, 1.01]", "goodput_smollm2_epyc-avx2-fp32.json")]
    assert "T0 (output tokens/s at concurrency 1 / 2" in rows[0][0] and ", T1 (" in rows[1][0]
    item = goodput_item("goodput_smollm2_epyc-avx2-fp32.json", a)[0]
    for value in ("1.17x [1.12, 1.21]", "1.10x [1.00, 1.20]", "0.99x [0.97, 1.01]"):
        assert value in item
    assert "fixed 1.15x [1.10, 1.20]" in item and "batch 1: 1.01, 2: 0.99" in item
    assert goodput_item("g", {"levels": []}) == []


def test_machine_kind_names_vendor_simd_and_serving_dtype():
    from sglang_specopd.app.results import machine_kind

    assert machine_kind({"cpu": "AMD EPYC 9R14", "cpu_simd": "AVX2", "cpu_native_bf16": False}) == "epyc-avx2-fp32"
    assert machine_kind({"cpu": "Intel(R) Xeon(R) Processor", "cpu_simd": "AVX512", "cpu_native_bf16": True}) \
        == "xeon-avx512-bf16"
    assert machine_kind({"gpu": "NVIDIA H100 80GB HBM3"}) == "nvidia-h100-80gb-hbm3"
