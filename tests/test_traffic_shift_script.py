"""``benchmarks/shift/run.py`` without servers: its options, the arms' paired differences against the static arm
(hand-checkable), the ITL / load statistics of streamed records, and the result file's keys and plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def _rows(domain, taus, prefix="p"):
    return [{"id": f"{prefix}{i}", "domain": domain, "completion_tokens": int(t * 10), "verify_steps": 10}
            for i, t in enumerate(taus)]


def _final(new_taus, old_taus):
    from specopd_trainer.intervals import acceptance_intervals

    out = {}
    for group, domains, taus in (("new", ("japanese", "wordsort"), new_taus), ("old", ("coding",), old_taus)):
        rows = [r for d in domains for r in _rows(d, taus, prefix=d)]
        out[group] = {"T0": acceptance_intervals(rows, list(domains)), "per_request": rows}
    return out


def _record(done, error=None, gaps=(0.1, 0.2), tokens=10):
    from sglang_specopd.app.traffic_load import ChatRecord

    return ChatRecord("x", "japanese", done - 1, done, 200 if error is None else 500, error, tokens, 0.3, gaps)


def _arm(new_taus, old_taus, itl_gaps):
    from shift.measure import itl_percentiles, load_stats

    recs = [_record(10.0 + i, gaps=itl_gaps) for i in range(5)] + [_record(12.5, error="503")]
    return {"curve": [{"t_s": 0.0, "new_tau": 1.0, "new_ci95": [0.9, 1.1]}], "final": _final(new_taus, old_taus),
            "pushes": 1, "rollbacks": 0, "traffic_tokens_seen": 100, "trained_tokens": 50,
            "itl_shift_s": itl_percentiles(recs, 0, 100), "load_shift": load_stats(recs, 0, 100),
            "load_all": load_stats(recs, 0, 100)}


def test_paired_differences_against_the_static_arm_and_the_statistics():
    from shift.measure import itl_percentiles, load_stats
    from shift.result import arm_key, assemble, missing_arms, paired_vs_static

    assert [arm_key(a) for a in (None, "sft", "draft-opd", "specopd")] == \
        ["static", "sft_from_traffic", "draft_opd_from_traffic", "specopd_from_traffic"]
    base = [1.0, 1.2, 1.4, 1.1]
    arms = {"static": _arm(base, base, (0.1,)), "sft_from_traffic": _arm([t + 0.5 for t in base], base, (0.1, 0.4))}
    diff = paired_vs_static(arms)["sft_from_traffic"]
    assert diff["new"]["mean"] == pytest.approx(0.5) and diff["new"]["ci95"] == pytest.approx([0.5, 0.5])
    assert diff["old"]["mean"] == pytest.approx(0.0) and diff["old"]["inside_noise"]
    recs = [_record(5.0, gaps=(0.1, 0.3)), _record(50.0, gaps=(9.0,)), _record(6.0, error="timeout")]
    assert itl_percentiles(recs, 0, 10)["gaps"] == 2 and itl_percentiles(recs, 0, 10)["p50"] == pytest.approx(0.2)
    st = load_stats(recs, 0, 10)
    assert st["requests"] == 2 and st["completion_tokens"] == 10 and st["errors"] == {"timeout": 1}
    assert st["output_tokens_per_s"] == pytest.approx(1.0) and st["errors_5xx"] == 0
    settings = {"new_domains": ["japanese", "wordsort"], "old_domains": ["coding"], "shift_minutes": 1,
                "old_minutes": 1, "streams": 3, "max_tokens": 96, "curve_per_domain": 2, "eval_new": 4, "eval_old": 4,
                "eval_max_new_tokens": 64, "capture": True, "arms": ["static", "sft", "specopd"]}
    res = assemble(settings, arms, {"serving_overhead_fraction": 0.01}, {"japanese": "a", "wordsort": "b"})
    assert res["errors_5xx"] == 2 and res["itl_p99_s"]["no_adapter"] == pytest.approx(0.1)
    assert res["itl_p99_s"]["adapter"] == pytest.approx(itl_percentiles(
        [_record(1.0, gaps=(0.1, 0.4))] * 5, 0, 10)["p99"])
    for key in ("new_domains", "old_domains", "shift_minutes", "load", "arms", "paired_diff_vs_static", "errors_5xx",
                "itl_p99_s", "features_captured_while_serving", "feature_cost"):
        assert key in res
    assert missing_arms(settings, arms) == ["specopd"]
    json.dumps(res)  # JSON-able


def test_options_and_plot(tmp_path):
    import shift as pkg  # noqa: F401  (the package beside the script)
    from shift.plot import plot

    import importlib.util

    spec = importlib.util.spec_from_file_location("traffic_shift_script", BENCH / "shift" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    s = mod.settings_of(mod.parse(["--arms", "static,sft", "--curve-minutes", "0,2.5", "--shift-minutes", "3"]))
    assert s["arms"] == ["static", "sft"] and s["curve_minutes"] == [0.0, 2.5] and s["shift_minutes"] == 3.0
    assert s["algorithm_options"] == {"sft": {"seqs_per_step": 4}}
    res = {"new_domains": {"japanese": "a"}, "arms": {"static": {"curve": [
        {"t_s": 0.0, "new_tau": 1.0, "new_ci95": [0.9, 1.1]}, {"t_s": 60.0, "new_tau": 1.0, "new_ci95": [0.9, 1.1]}]}}}
    out = plot(res, tmp_path / "curve.png")
    assert out.is_file() and out.stat().st_size > 1000


def test_every_arm_runs_by_default_and_records_where_it_came_from():
    import importlib.util

    from shift.result import arm_key, missing_arms

    spec = importlib.util.spec_from_file_location("traffic_shift_script", BENCH / "shift" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    s = mod.settings_of(mod.parse([]))
    assert s["arms"] == ["static", "sft", "draft-opd", "specopd", "auto"]
    assert arm_key("auto") == "auto_from_traffic"
    assert missing_arms(s, {"static": {}, "sft_from_traffic": {}}) == ["draft-opd", "specopd", "auto"]
    prov = mod.provenance()
    assert prov["copied_from_earlier_run"] is False and prov["ran_at"].endswith("Z")
    assert prov["git_commit"] is None or len(prov["git_commit"].split("+")[0]) == 40


def test_the_auto_arm_trains_sft_first_with_the_sft_options(tmp_path, monkeypatch):
    from shift import arm

    seen = {}

    class FakeAdapter:
        def __init__(self, client, drafter, run_dir, cfg, **kw):
            seen["cfg"] = cfg

    import specopd_trainer.adapt.loop as loop
    import specopd_trainer.drafters.registry as dreg

    monkeypatch.setattr(loop, "Adapter", FakeAdapter)
    monkeypatch.setattr(dreg, "drafter_class_for_checkpoint",
                        lambda p: type("D", (), {"from_pretrained": staticmethod(lambda *a: object())}))
    spec = type("S", (), {"drafter_path": "x"})
    opts = {"sft": {"seqs_per_step": 4}, "draft-opd": {"rejected_slots": "first"}}
    arm._adapter("http://127.0.0.1:1", spec, tmp_path, "auto", {"lr": 1e-4, "algorithm_options": opts}, tmp_path)
    cfg = seen["cfg"]
    assert cfg.algorithm == "auto" and cfg.algorithm_options == {"seqs_per_step": 4}
    assert cfg.auto_options == {"draft-opd": {"rejected_slots": "first"}}
