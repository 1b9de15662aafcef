"""benchmarks/goodput/run.py: throughput ratios with paired intervals, per-level policy deltas, the result file."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from _scripts import load_benchmark


def _rec(i, tokens, latency, ok=True):
    return {"id": f"coding/{i}", "ok": ok, "completion_tokens": tokens, "latency_s": latency}


def test_ratio_ci_is_paired_and_exact_on_constant_ratios() -> None:
    gp = load_benchmark("goodput")
    base = [_rec(i, 64, 2.0 + i) for i in range(10)]
    arm = [_rec(i, 64, (2.0 + i) / 1.25) for i in range(10)]  # every prompt 1.25x faster
    got = gp.ratio_ci(arm, base)
    assert got["mean"] == pytest.approx(1.25) and got["ci95"] == pytest.approx([1.25, 1.25]) and got["prompts"] == 10
    noisy = [_rec(i, 64, (2.0 + i) / (1.25 if i % 2 else 0.8)) for i in range(10)] + [_rec(99, 64, 1.0, ok=False)]
    got = gp.ratio_ci(noisy, base)
    assert got["ci95"][0] < got["mean"] < got["ci95"][1] and got["prompts"] == 10  # the failed one is left out
    with pytest.raises(ValueError):
        gp.ratio_ci([_rec(0, 1, 1.0, ok=False)], base)


def _stats(steps, hist, reasons, step_ms, target_ms, draft_ms, rows):
    return {"steps": steps, "k_histogram": {str(k): v for k, v in hist.items()}, "reasons": reasons,
            "breakdown": {"steps": steps, "step": step_ms, "target_forward": target_ms, "drafter_forward": draft_ms,
                          "other": step_ms - target_ms - draft_ms, "verify_rows": rows}}


def test_stats_delta_gives_the_levels_own_histogram_and_means() -> None:
    gp = load_benchmark("goodput")
    before = _stats(10, {0: 4, 3: 6}, {"calibrate": 8, "goodput": 2}, 100.0, 80.0, 10.0, 3.0)
    after = _stats(30, {0: 4, 3: 26}, {"calibrate": 8, "goodput": 22}, 90.0, 70.0, 10.0, 3.6)
    d = gp.stats_delta(before, after)
    assert d["steps"] == 20 and d["k_histogram"] == {0: 0, 3: 20} and d["reasons"] == {"goodput": 20}
    # (30 * 90 - 10 * 100) / 20 = 85 ms; rows (30 * 3.6 - 10 * 3) / 20 = 3.9
    assert d["breakdown_ms"]["step"] == pytest.approx(85.0) and d["breakdown_ms"]["verify_rows"] == pytest.approx(3.9)
    assert d["breakdown_ms"]["target_forward"] == pytest.approx(65.0)


def _runs(factor_fixed=0.8, factor_goodput=1.1):
    base = [_rec(i, 64, 2.0 + i) for i in range(6)]
    pol = {"steps": 5, "k_histogram": {0: 2, 3: 3}, "reasons": {"goodput": 5},
           "breakdown_ms": {"step": 90.0, "target_forward": 70.0, "drafter_forward": 12.0, "other": 8.0,
                            "verify_rows": 2.8}}
    return {"plain": {"records": base, "tokens_per_s": 20.0, "tau": None, "policy": None, "itl_mean_s": 0.05,
                      "errors": 0},
            "fixed": {"records": [_rec(i, 64, (2.0 + i) / factor_fixed) for i in range(6)], "tokens_per_s": 16.0,
                      "tau": 1.7, "policy": pol, "errors": 0},
            "goodput": {"records": [_rec(i, 64, (2.0 + i) / factor_goodput) for i in range(6)], "tokens_per_s": 22.0,
                        "tau": 1.5, "policy": pol, "errors": 0}}


def test_level_summary_and_breakdown_have_the_result_keys() -> None:
    gp = load_benchmark("goodput")
    lv = gp.level_summary(_runs(), 1, 0.0)
    for key in ("plain_tokens_per_s", "fixed_tokens_per_s", "goodput_tokens_per_s", "goodput_over_plain",
                "fixed_over_plain", "goodput_over_plain_ci95", "fixed_over_plain_ci95", "k_histogram"):
        assert key in lv, key
    assert lv["fixed_over_plain"] == pytest.approx(0.8) and lv["goodput_over_plain"] == pytest.approx(1.1)
    assert lv["k_histogram"] == {0: 2, 3: 3} and lv["plain_step_ms"] == pytest.approx(50.0)
    b = gp.breakdown([lv, {**lv, "concurrency": 4}])
    assert b["concurrency"] == 1 and b["plain"]["step"] == pytest.approx(50.0)
    assert b["goodput"]["target_forward"] == 70.0 and b["fixed"]["drafter_forward"] == 12.0


def _without_servers(monkeypatch, policy: dict):
    """The goodput script with stand-in servers (each arm's run from :func:`_runs`), tokenizer and prompts:
    (the module, the list of arm tuples each server group started)."""
    gp = load_benchmark("goodput")
    from types import SimpleNamespace

    import transformers

    import sglang_specopd.app.bench.runner as runner

    @contextlib.contextmanager
    def fake_servers(config, drafter, arms=gp.ARMS, say=print, block_size=None):
        started.append(tuple(arms))
        yield {arm: SimpleNamespace(role=arm, url=f"http://{arm}") for arm in arms}, "/models/x"

    runs, started = _runs(), []
    monkeypatch.setattr(gp, "three_servers", fake_servers)
    monkeypatch.setattr(gp, "run_arm", lambda server, *a: runs[server.role])
    monkeypatch.setattr(gp, "_policy", lambda url: policy)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda path: None))
    monkeypatch.setattr(runner, "load_prompts", lambda tok, domains, limit: (["p"] * limit, {d: 0 for d in domains}))
    return gp, started


def test_main_writes_the_result_without_servers(tmp_path: Path, monkeypatch) -> None:
    gp, started = _without_servers(monkeypatch, {"gamma": 7, "cost_curve_ms": {"1": [50.0, 51.0, 60.0]}})
    k0 = {"k0_step_over_plain_step": {"1": 1.01, "2": 1.0, "4": 0.99, "8": 1.02}}
    monkeypatch.setattr(gp, "k0_step", lambda config, drafter, waves, say=print: k0)
    out = tmp_path / "goodput.json"
    assert gp.main(["--drafter", "/d", "--concurrency", "1,2", "--temperatures", "0,1", "--limit", "3",
                    "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(lv["concurrency"], lv["temperature"]) for lv in data["levels"]] == [(1, 0.0), (2, 0.0), (1, 1.0),
                                                                                (2, 1.0)]
    assert data["levels"][1]["order"] == ["fixed", "goodput", "plain"]  # the order rotates between levels
    assert data["counts_as_result"] is False and data["gamma"] == 7
    assert data["cost_curve_ms"] == {"1": {"1": 50.0, "2": 51.0, "3": 60.0}}
    assert set(data["step_breakdown_ms"]) >= {"plain", "fixed", "goodput"}
    assert data["command"].startswith("python benchmarks/goodput/run.py --drafter /d") and started == [gp.ARMS]
    assert data["k0_step_over_plain_step"] == k0["k0_step_over_plain_step"]
    started.clear()
    assert gp.main(["--drafter", "/d", "--concurrency", "1,2", "--temperatures", "0", "--limit", "3",
                    "--out", str(out), "--one-server-at-a-time", "--k0-waves", "0"]) == 0
    assert started == [("plain",), ("fixed",), ("goodput",)]
    data = json.loads(out.read_text())
    assert "k0_step_over_plain_step" not in data
    assert data["one_server_at_a_time"] is True and len(data["levels"]) == 2


def test_k0_step_forces_k0_with_or_without_plain_decode() -> None:
    import importlib.util

    from sglang_specopd.server.goodput.policy import GoodputPolicy
    from sglang_specopd.wire.policy import PolicySettings

    spec = importlib.util.spec_from_file_location("k0_step", Path(__file__).resolve().parents[1] / "benchmarks" /
                                                  "goodput" / "k0_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for plain in (True, False):
        settings = PolicySettings.model_validate(mod.forced_k0(7, plain))
        assert settings.plain_k0 is plain and settings.explore_every == 0
        pol = GoodputPolicy(7, settings)
        est = pol.new_request_estimate()
        assert {pol.plan([est] * bs) for bs in (1, 2, 4, 8) for _ in range(40)} == {(0, "given")}


def test_k0_step_ratio_is_over_rounds_and_its_interval_pairs_rounds() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("k0_step", Path(__file__).resolve().parents[1] / "benchmarks" /
                                                  "goodput" / "k0_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # two rounds: a fast machine state (plain 60, k0 66) and a slow one (plain 90, k0 93)
    plain = [{"1": {"itl_median_ms": 60.0}}, {"1": {"itl_median_ms": 90.0}}]
    k0 = [{"1": {"itl_median_ms": 66.0}}, {"1": {"itl_median_ms": 93.0}}]
    assert mod.ratio_of_means(k0, plain, [1], "itl_median_ms") == {"1": pytest.approx(159 / 150)}
    lo, hi = mod.paired_round_ci(k0, plain, [1], "itl_median_ms")["1"]
    # resampling rounds (kept paired): all-fast 1.1, all-slow 93/90, mixed 159/150
    assert lo == pytest.approx(93 / 90) and hi == pytest.approx(1.1)
    assert mod.paired_round_ci(k0[:1], plain[:1], [1], "itl_median_ms") == {"1": None}
    assert mod.spread([60.0, 90.0]) == pytest.approx(1.5) and mod.spread([60.0, None]) is None
    assert mod.ratio_of_means(k0, [{"1": {"itl_median_ms": None}}], [1], "itl_median_ms") == {"1": None}


def test_the_fixed_arm_can_be_left_out(tmp_path: Path, monkeypatch) -> None:
    """``--arms plain,goodput``: two servers, levels without fixed keys, the report item without a fixed ratio;
    an arm list without plain or goodput is refused before anything starts."""
    from sglang_specopd.app.bench.report.goodput import goodput_item

    gp, started = _without_servers(monkeypatch, {"gamma": 7})
    out = tmp_path / "goodput.json"
    assert gp.main(["--drafter", "/d", "--concurrency", "1", "--temperatures", "0", "--limit", "3", "--arms",
                    "goodput,plain", "--k0-waves", "0", "--out", str(out)]) == 0
    assert started == [("plain", "goodput")]
    data = json.loads(out.read_text())
    (lv,) = data["levels"]
    assert data["arms"] == ["plain", "goodput"] and lv["order"] == ["plain", "goodput"]
    assert "fixed_over_plain" not in lv and lv["goodput_over_plain"] == pytest.approx(1.1)
    assert set(data["step_breakdown_ms"]) == {"concurrency", "temperature", "plain", "goodput"}
    item = goodput_item("g.json", data)[0]
    assert "**Goodput policy vs plain serving**" in item and "c=1 goodput 1.10x" in item and "fixed" not in item
    for bad in ("plain,fixed", "goodput,fixed", "plain,goodput,eagle"):
        with pytest.raises(SystemExit):
            gp.main(["--drafter", "/d", "--arms", bad, "--out", str(out)])
    assert started == [("plain", "goodput")]
