"""benchmarks/fleetbench/run.py without servers: throughput intervals and the paired 2-vs-1 ratio, the drafter-version check
of responses around commits, rollout timings, the kill -9 fault entry, and the result file (history, plot)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from _scripts import load_benchmark

FLEET = load_benchmark("fleetbench")  # puts benchmarks/ on sys.path: fleetbench is importable from here on
from fleetbench import stats  # noqa: E402


def _row(i, tokens, latency, domain="coding", ok=True, error=None):
    return {"id": f"{domain}/{i}", "domain": domain, "ok": ok, "completion_tokens": tokens, "latency_s": latency,
            "error": error, "verify_ct": tokens // 2 if ok else None}


def test_throughput_interval_is_the_measured_throughput_with_a_prompt_bootstrap() -> None:
    rows = [_row(i, 64, 2.0 * (i + 1)) for i in range(4)] + [_row(9, 0, 1.0, ok=False, error="HTTP 502: x")]
    got = stats.throughput_interval(rows, duration_s=10.0)
    assert got["mean"] == pytest.approx(256 / 10.0) and got["prompts"] == 4
    assert got["inflight"] == pytest.approx(20.0 / 10.0)  # sum of the completed requests' latencies / duration
    assert got["ci95"][0] < got["mean"] < got["ci95"][1]
    # every request at the same rate: nothing to resample, the interval is the point
    same = [_row(i, 10 * (i + 1), 1.0 * (i + 1)) for i in range(5)]
    assert stats.throughput_interval(same, 3.0)["ci95"] == pytest.approx([50.0, 50.0])
    # stratified by domain: each domain constant inside keeps its count in every replicate -> no spread
    strat = [_row(i, 10, 1.0, "math") for i in range(3)] + [_row(i, 40, 1.0, "agentic") for i in range(5)]
    got = stats.throughput_interval(strat, 4.0)
    assert got["ci95"] == pytest.approx([got["mean"]] * 2) and got["mean"] == pytest.approx(230 / 4.0)
    assert stats.throughput_interval([_row(0, 0, 1.0, ok=False)], 1.0)["ci95"] is None
    with pytest.raises(ValueError):
        stats.throughput_interval(rows, 0.0)


def test_paired_ratio_is_exact_on_a_uniform_speedup_and_paired() -> None:
    base = [_row(i, 64, 2.0 + i, d) for i, d in enumerate(["math", "coding"] * 5)]
    arm = [_row(i, 64, (2.0 + i) / 2, d) for i, d in enumerate(["math", "coding"] * 5)]  # every prompt twice as fast
    got = stats.paired_ratio_interval(arm, 30.0, base, 60.0)  # ... and the level took half the time
    assert got["mean"] == pytest.approx(2.0) and got["ci95"] == pytest.approx([2.0, 2.0]) and got["prompts"] == 10
    noisy = [_row(i, 64, (2.0 + i) / (2.4 if i % 2 else 1.6), d) for i, d in enumerate(["math", "coding"] * 5)]
    dur = sum(r["latency_s"] for r in noisy) / (sum(r["latency_s"] for r in base) / 60.0)  # same mean in flight
    got = stats.paired_ratio_interval(noisy + [_row(99, 1, 1.0, ok=False)], dur, base, 60.0)
    assert got["ci95"][0] < got["mean"] < got["ci95"][1] and got["prompts"] == 10  # the failed one left out
    measured = (sum(r["completion_tokens"] for r in noisy) / dur) / (64 * 10 / 60.0)
    assert got["mean"] == pytest.approx(measured)
    with pytest.raises(ValueError):
        stats.paired_ratio_interval([_row(0, 1, 1.0, ok=False)], 1.0, base, 60.0)


def _level(workers, conc, factor=1.0, errors=()):
    rows = [_row(i, 64, (2.0 + i) / factor, d) for i, d in enumerate(["math", "coding"] * 4)]
    rows += [_row(100 + k, 0, 0.5, ok=False, error=e) for k, e in enumerate(errors)]
    summary = {"itl_p50_s": 0.05 / factor, "itl_p99_s": 0.2 / factor, "ttft_p50_s": 0.3, "error_messages": list(errors)}
    dur = 40.0 / factor
    return stats.level_entry(workers, conc, rows, dur, summary, {"mean": 1.7, "ci95": [1.6, 1.8], "dialogue": 1.5},
                             {"http://w0": 100, "http://w1": 90})


def test_level_entry_has_the_result_keys_and_counts_5xx() -> None:
    lv = _level(2, 4, errors=("HTTP 502: bad gateway", "ConnectError: refused", "HTTP 429: busy"))
    for key in ("workers", "concurrency", "output_tokens_per_s", "itl_p99_s", "errors_5xx"):  # results.md
        assert key in lv, key
    assert lv["errors"] == 3 and lv["errors_5xx"] == 1
    assert lv["errors_by_status"] == {"429": 1, "502": 1, "transport": 1}
    assert lv["tau"] == {"mean": 1.7, "ci95": [1.6, 1.8]} and lv["completed"] == 8 and lv["requests"] == 11
    assert lv["output_tokens_per_s"] == pytest.approx(8 * 64 / 40.0)
    assert set(lv["rows"][0]) == {"id", "domain", "ok", "completion_tokens", "latency_s", "verify_ct"}
    assert stats.http_status("HTTP 503: x") == 503 and stats.http_status("timeout after 5 s") is None


def test_scaling_pairs_each_arm_with_one_worker_at_the_same_concurrency() -> None:
    levels = [_level(1, 1), _level(1, 16), _level(2, 1, factor=1.5), _level(2, 16, factor=1.8), _level(2, 8)]
    got = stats.scaling(levels)
    assert [(s["workers"], s["concurrency"]) for s in got] == [(2, 1), (2, 16)]  # no 1-worker level at 8
    assert got[1]["throughput_ratio"] == pytest.approx(1.8) and got[1]["throughput_ratio_ci95"] == pytest.approx(
        [1.8, 1.8])
    assert got[1]["itl_p99_s"] == {"1": pytest.approx(0.2), "2": pytest.approx(0.2 / 1.8)}


def _s(t_send, t_end, versions, ok=True, status=200, target="router"):
    return {"target": target, "t_send": t_send, "t_end": t_end, "ok": ok, "status": status, "versions": versions}


def test_version_check_around_commits() -> None:
    commits = [{"version": "v1", "t_start": 10.0, "t_end": 11.0}, {"version": "v2", "t_start": 20.0, "t_end": 21.0}]
    samples = [
        _s(1.0, 5.0, ["v0"]),  # before any commit, the initial version
        _s(8.0, 12.0, ["v0", "v1"]),  # in flight across the first commit: both, legitimately
        _s(9.0, 10.5, ["v1"]),  # sent before the commit returned: v1 may already draft
        _s(11.5, 13.0, ["v1"]),  # after the commit: v1 only, fine
        _s(12.0, 14.0, ["v0"]),  # after the commit returned, drafted by v0: stale
        _s(12.0, 15.0, ["v0", "v1"]),  # after it, still partly v0: mixed
        _s(18.0, 22.0, ["v1", "v2"]),  # after v1, across v2's commit: fine
        _s(19.0, 19.5, ["v2"]),  # after v1, no later commit started before it ended: v2 is not possible -> stale
        _s(22.0, 23.0, ["v2"]),
        _s(22.0, 23.0, []),  # no verify step
        _s(3.0, 3.1, [], ok=False, status=502),
        _s(3.0, 3.1, [], ok=False, status=None),
        _s(2.0, 4.0, ["v9"]),  # before any commit but not the initial version
    ]
    got = stats.version_check(samples, commits, "v0")
    assert got["responses"] == 13 and got["completed"] == 11 and got["no_version"] == 1
    assert got["after_commit"] == 6 and got["stale_after_commit"] == 2 and got["mixed_after_commit"] == 1
    assert got["spanning_commit"] == 2 and got["unexpected_before_commit"] == 1
    assert got["errors"] == 2 and got["errors_5xx"] == 1 and got["errors_by_status"] == {"502": 1, "transport": 1}
    kinds = [(e["kind"], e["committed"]) for e in got["examples"]]
    assert kinds == [("stale_after_commit", "v1"), ("mixed_after_commit", "v1"), ("stale_after_commit", "v1")]
    # the base commit of a phase: the version served when it began counts as committed at its start
    base = stats.with_base_commit([], "v2", 0.0)
    assert stats.version_check([_s(1.0, 2.0, ["initial"])], base, "v2")["stale_after_commit"] == 1
    by = stats.checks_by_target(samples + [_s(1.0, 2.0, ["v0"], target="direct:w0")], commits, "v0")
    assert set(by) == {"router", "direct:w0"} and by["direct:w0"]["completed"] == 1


def _events():
    return [{"url": "w0", "op": "stage", "t0": 1.0, "t1": 1.5, "ok": True},
            {"url": "w1", "op": "stage", "t0": 1.6, "t1": 2.4, "ok": True},
            {"url": "w0", "op": "commit", "t0": 2.5, "t1": 2.7, "ok": True},
            {"url": "w1", "op": "commit", "t0": 2.5, "t1": 2.9, "ok": True},
            {"url": "w0", "op": "verify", "t0": 3.0, "t1": 3.2, "ok": True},
            {"url": "w1", "op": "verify", "t0": 3.0, "t1": 3.4, "ok": True}]


def test_rollout_timing_and_summary() -> None:
    t = stats.rollout_timing(_events(), 0.9, 3.5)
    assert t["stage_s"] == pytest.approx(1.4) and t["commit_s"] == pytest.approx(0.4)
    assert t["verify_s"] == pytest.approx(0.4) and t["abort_s"] is None and t["total_s"] == pytest.approx(2.6)
    assert t["commit_window"] == [2.5, 2.9] and t["per_worker"]["w1"]["stage_s"] == pytest.approx(0.8)
    recs = [{"version": f"v{k}", "committed": True, "ok": True, **stats.rollout_timing(
        [{**e, "t0": e["t0"] + 10 * k, "t1": e["t1"] + 10 * k} for e in _events()], 0.9 + 10 * k, 3.5 + 10 * k)}
        for k in range(3)] + [{"version": "v9", "committed": False, "ok": False, "stage_s": 9.0, "commit_s": None}]
    assert [c["version"] for c in stats.commit_windows(recs)] == ["v0", "v1", "v2"]
    checks = {"router": {"stale_after_commit": 0, "mixed_after_commit": 1, "after_commit": 50, "errors_5xx": 2,
                         "errors": 3, "spanning_commit": 4},
              "direct:w0": {"stale_after_commit": 1, "mixed_after_commit": 0, "after_commit": 5, "errors_5xx": 0,
                            "errors": 0, "spanning_commit": 0}}
    got = stats.rollout_summary(recs, checks, concurrency=8)
    for key in ("stage_s", "commit_s", "under_load", "mixed_version_responses", "stale_after_commit"):  # results.md
        assert key in got, key
    assert got["rollouts"] == 4 and got["committed"] == 3 and got["verified"] == 3
    assert got["stage_s"] == pytest.approx(1.4) and got["phases"]["commit_s"]["n"] == 3  # committed ones only
    assert got["stale_after_commit"] == 1 and got["mixed_version_responses"] == 1 and got["errors_5xx"] == 2
    assert stats.mean_interval([])["mean"] is None and stats.mean_interval([2.0, 2.0])["ci95"] == [2.0, 2.0]


def test_fault_entry_of_a_kill_at_commit_with_a_rejoin() -> None:
    rollout = {"version": "v2", "committed": True, "missed": ["w1"], "refused": [], "stage_s": 1.0, "commit_s": 2.0,
               "abort_s": None, "verify_s": 1.5, "total_s": 4.5, "per_worker": {}, "commit_window": [10.0, 12.0]}
    samples = [_s(5.0, 11.0, ["v1", "v2"]),  # across the commit
               _s(9.0, 10.5, [], ok=False, status=502),  # on the killed worker: in flight at the kill (10.2)
               _s(13.0, 14.0, ["v2"]),  # the survivor after the commit
               _s(31.0, 32.0, ["initial"]),  # the restarted worker before its reconcile (rejoin window 20-40)
               _s(45.0, 46.0, ["v2"]),
               _s(33.0, 34.0, ["initial"], target="direct:w1")]
    rejoin = {"restart_s": 18.0, "reconcile_s": 2.0, "reconciled": True, "serving": "v2", "error": None,
              "window": [20.0, 40.0]}
    e = stats.fault_entry(phase="commit", victim="w1", survivor="w0", rollout=rollout, t_kill=10.2,
                          survivor_serving="v2", initial="v1", samples=samples, rejoin=rejoin, t0=1.0, t_stop=50.0,
                          concurrency=8, healthy_after=2)
    for key in ("what", "lost_steps", "lost_requests", "outcome"):  # results.md
        assert key in e, key
    assert e["killed"] and e["committed"] and e["lost_requests"] == 1 and e["lost_requests_in_flight_at_kill"] == 1
    assert e["router_outside_rejoin"]["stale_after_commit"] == 0
    assert e["router_during_rejoin"]["stale_after_commit"] == 1
    assert e["direct"]["direct:w1"]["stale_after_commit"] == 1 and e["rejoin"]["window_s"] == [19.0, 39.0]
    assert e["outcome"].startswith("commit + reconcile") and "survivor serves v2 (as it should)" in e["outcome"]
    assert "in report.missed" in e["outcome"] and "the router answered 1 requests with an old drafter" in e["outcome"]
    aborted = stats.fault_entry(phase="stage", victim="w1", survivor="w0", rollout={**rollout, "committed": False,
                                                                                   "missed": []},
                                t_kill=10.2, survivor_serving="v1", initial="v1", samples=samples[:3], rejoin=None,
                                t0=1.0, t_stop=20.0, concurrency=8, healthy_after=1)
    assert aborted["outcome"].startswith("abort everywhere") and "serves v1 (as it should)" in aborted["outcome"]
    assert aborted["router"]["stale_after_commit"] == 1  # v2 was never committed: a v2 response would be wrong
    assert aborted["router_during_rejoin"] is None


def _fake_fleet(n):
    workers = [SimpleNamespace(url=f"http://127.0.0.1:{31000 + i}", cpu_cores=[i]) for i in range(n)]
    return SimpleNamespace(start_s=2.0, router_url="http://127.0.0.1:30999", workers=workers,
                           specs=[SimpleNamespace(model_path="/models/x")])


def test_main_writes_the_result_and_the_plot_without_servers(tmp_path: Path, monkeypatch) -> None:
    from fleetbench import phases

    import sglang_specopd.app.bench.runner as runner
    import sglang_specopd.app.fleet.plan as plan
    from sglang_specopd.app import results as R

    monkeypatch.setattr(R, "_WRITTEN", set())
    started = []

    @contextlib.contextmanager
    def fake_fleet(config, n, cores, **kw):
        started.append((n, list(cores[:n]), kw["policy"]))
        yield _fake_fleet(n)

    factor = {1: 1.0, 2: 1.8}
    monkeypatch.setattr(phases, "started_fleet", fake_fleet)
    monkeypatch.setattr(phases, "warm_up", lambda *a, **k: None)
    monkeypatch.setattr(phases, "measure_level", lambda fl, prompts, c, params, **k: _level(
        len(fl.workers), c, factor[len(fl.workers)]))
    monkeypatch.setattr(phases, "Rollouts", lambda *a, **k: SimpleNamespace(close=lambda: None))
    rollout = stats.rollout_summary([{"version": "bench-v1", "committed": True, "ok": True, **stats.rollout_timing(
        _events(), 0.9, 3.5)}], {"router": stats.version_check([_s(4.0, 5.0, ["bench-v1"])], [], "bench-v1")},
        concurrency=8)
    monkeypatch.setattr(phases, "measure_rollouts", lambda *a, **k: rollout)
    kills = []

    def fake_kill(fl, ro, ids, *, phase, **k):
        kills.append(phase)
        return stats.fault_entry(phase=phase, victim="w1", survivor="w0", rollout={
            "version": "bench-v2", "committed": phase == "commit", "missed": ["w1"] if phase == "commit" else []},
            t_kill=2.0, survivor_serving="bench-v2" if phase == "commit" else "bench-v1", initial="bench-v1",
            samples=[_s(1.5, 2.5, ["bench-v1"])], rejoin=None, t0=1.0, t_stop=3.0, concurrency=8, healthy_after=2)

    monkeypatch.setattr(phases, "kill_scenario", fake_kill)
    from fleetbench import training

    def fake_train(fl, args, admin, state, domains, say):
        n = len(fl.workers)
        secs = [2.0 / factor[n]] * 4
        return {"workers": n, "exit_code": 0, "steps_logged": 5, "supervised_tokens_per_s": 100 * factor[n],
                "per_step": {"steps": [2, 3, 4, 5], "tokens": [200.0] * 4, "seconds": secs}}

    monkeypatch.setattr(training, "fleet_run", fake_train)
    monkeypatch.setattr(training, "kill_during_training", lambda *a, **k: {
        "what": "kill -9 worker during training", "lost_steps": [], "outcome": "trainer exit 0"})
    monkeypatch.setattr(plan, "available_cores", lambda: [0, 1])
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda path: None))
    prompt = SimpleNamespace(prompt_ids=tuple(range(40)))
    monkeypatch.setattr(runner, "load_prompts", lambda tok, domains, limit: ([prompt] * limit * len(domains),
                                                                             {d: 0 for d in domains}))
    out = tmp_path / "results" / "fleet.json"
    argv = ["--drafter", "/d", "--concurrency", "1,16", "--limit", "2", "--out", str(out)]
    assert FLEET.main(argv) == 0
    assert started == [(1, [0], "round_robin"), (2, [0, 1], "round_robin")] and kills == ["stage", "commit"]
    data = json.loads(out.read_text())
    assert data["command"].startswith("python benchmarks/fleetbench/run.py --drafter /d --concurrency 1,16 --limit 2 --out ")
    assert data["status"] == "complete"
    assert [(lv["workers"], lv["concurrency"]) for lv in data["levels"]] == [(1, 1), (1, 16), (2, 1), (2, 16)]
    assert data["counts_as_result"] is False and data["router"]["package"] == "sglang-router"
    assert data["scaling"][1]["concurrency"] == 16 and data["scaling"][1]["throughput_ratio"] == pytest.approx(1.8)
    assert data["rollout"]["stage_s"] == pytest.approx(1.4)
    assert [f["what"] for f in data["faults"]] == ["kill -9 worker during rollout (at its stage)",
                                                   "kill -9 worker during rollout (at its commit)",
                                                   "kill -9 worker during training"]
    assert data["training"]["status"] == "measured" and sorted(data["training"]["workers"]) == ["1", "2"]
    ratio = data["training"]["ratios"]["2_vs_1"]
    assert ratio["supervised_tokens_per_s_ratio"] == pytest.approx(1.8) and ratio["ci95"] == pytest.approx([1.8, 1.8])
    fl = data["floors"]
    assert fl["levels_errors_5xx"] == 0 and fl["rollout_stale_or_mixed_after_commit"] == 0
    assert fl["kill_old_drafter_answers_after_commit"] == 0 and fl["kill_survivor_on_expected_version"] is True
    assert fl["ratio_at_16_vs_aim_1_7"] == pytest.approx(1.8) and fl["training_kill_lost_steps"] == [[]]
    assert out.with_suffix(".png").is_file()
    # a later run never overwrites: the earlier JSON and PNG move to history/
    R._WRITTEN.clear()  # as another run would
    assert FLEET.main(argv + ["--kill-phases", "", "--rollouts", "0", "--workers", "1", "--train-steps", "0"]) == 0
    hist = sorted(p.suffix for p in (out.parent / "history").iterdir())
    assert hist == [".json", ".png"]
    assert json.loads(out.read_text())["rollout"] is None and len(json.loads(out.read_text())["levels"]) == 2


def test_bad_options_are_refused_before_anything_starts(monkeypatch, capsys) -> None:
    import sglang_specopd.app.fleet.plan as plan

    monkeypatch.setattr(plan, "available_cores", lambda: [0])
    assert FLEET.main(["--drafter", "/d"]) == 2  # two workers, one core
    assert "2 workers need 2 distinct cores" in capsys.readouterr().err
    assert FLEET.main(["--drafter", "/d", "--kill-phases", "verify"]) == 2
    capsys.readouterr()
    assert FLEET.main(["--drafter", "/d", "--kill-at-step", "16"]) == 2
    assert "--kill-at-step must be in [1, --kill-train-steps) = [1, 16)" in capsys.readouterr().err
    with pytest.raises(ValueError):
        FLEET.pick_cores("0,0", 2, [0, 1])
    with pytest.raises(ValueError):
        FLEET.pick_cores("0,5", 2, [0, 1])
    assert FLEET.pick_cores("", 2, [3, 1, 2]) == [1, 2]


def test_version_load_records_versions_and_failures_per_target() -> None:
    import httpx

    from fleetbench import load as L

    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append((request.url.host, body["input_ids"], body["sampling_params"]))
        if request.url.host == "down":
            return httpx.Response(502, text="bad gateway")
        return httpx.Response(200, json={"meta_info": {"specopd_drafter_versions": ["v1"], "completion_tokens": 8}})

    with L.VersionLoad([("router", "http://up/", 2), ("direct:down", "http://down", 1), ("off", "http://x", 0)],
                       [[1, 2], [3]], 8, transport=httpx.MockTransport(handler)) as load:
        import time

        time.sleep(0.3)
    ok = [s for s in load.samples if s["target"] == "router"]
    bad = [s for s in load.samples if s["target"] == "direct:down"]
    assert ok and all(s["ok"] and s["versions"] == ["v1"] and s["completion_tokens"] == 8 for s in ok)
    assert all(s["t_send"] <= s["t_end"] for s in load.samples) and load.t_start <= load.t_stop
    assert 1 <= len(bad) <= 2 and not bad[0]["ok"] and bad[0]["status"] == 502  # paused after a failure
    assert {h for h, _, _ in sent} == {"up", "down"}  # a target with no loops gets nothing
    assert {tuple(ids) for _, ids, _ in sent} == {(1, 2), (3,)}
    assert sent[0][2] == {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


def test_timed_worker_runs_its_one_shot_hook_inside_the_timed_call() -> None:
    import threading

    from fleetbench.load import TimedWorker
    from specopd_trainer.fleet.worker import Step

    events, order = [], []
    clock = iter(range(100)).__next__
    w = TimedWorker("http://w0/", events=events, lock=threading.Lock(), clock=clock, admin_api_key="k")
    w.before["commit"] = lambda url: order.append(("hook", url))
    got = w._timed("commit", lambda: order.append("call") or Step(False, error="refused", status=None))
    w._timed("commit", lambda: Step(True))
    w.close()
    assert not got.ok and order == [("hook", "http://w0"), "call"] and w.before == {}  # ran once
    assert [(e["op"], e["t0"], e["t1"], e["ok"], e["error"]) for e in events] == [
        ("commit", 0, 1, False, "refused"), ("commit", 2, 3, True, None)]


def test_training_rates_are_ratios_of_step_sums_and_the_paired_ratio_matches_steps() -> None:
    from fleetbench import training

    rows = [{"step": k, "supervised_tokens": t, "supervised_wall_s": w}
            for k, t, w in ((1, 100, 10.0), (2, 300, 12.0), (3, 400, 16.0), (4, 700, 19.0))]
    rates = training.step_rates(list(reversed(rows)))  # any order
    assert rates == {"steps": [2, 3, 4], "tokens": [200.0, 100.0, 300.0], "seconds": [2.0, 4.0, 3.0]}
    point, ci = training.rate_interval(rates["tokens"], rates["seconds"])
    assert point == pytest.approx(600 / 9) and ci[0] <= point <= ci[1] and ci[0] >= 100 / 4 and ci[1] <= 100
    assert training.rate_interval([], []) == (None, None)
    half = {"steps": [2, 3, 4, 5], "tokens": [200.0, 100.0, 300.0, 50.0], "seconds": [1.0, 2.0, 1.5, 9.0]}
    r, rci = training.paired_step_ratio(half, rates)  # steps 2-4 in common: each twice as fast
    assert r == pytest.approx(2.0) and rci == pytest.approx([2.0, 2.0])
    assert training.paired_step_ratio(half, {"steps": [9], "tokens": [1.0], "seconds": [1.0]}) == (None, None)
    summary = training.summary({"1": {"per_step": rates}, "2": {"per_step": half}})
    assert summary["ratios"]["2_vs_1"]["supervised_tokens_per_s_ratio"] == pytest.approx(2.0)
    assert training.summary({}) == {"status": "not run", "workers": {}}


def test_cpu_split_is_cores_used_per_part_and_the_rest_of_the_machine() -> None:
    from fleetbench.cpu import cpu_seconds, cpu_split

    before = {"worker0": 10.0, "worker1": 20.0, "router": 1.0, "client": 5.0, "machine_busy": 100.0}
    after = {"worker0": 19.0, "worker1": 28.0, "router": 2.0, "client": 7.0, "machine_busy": 121.0}
    split = cpu_split(before, after, 10.0)["cores_used"]
    assert split == pytest.approx({"worker0": 0.9, "worker1": 0.8, "router": 0.1, "client": 0.2, "machine_busy": 2.1,
                                   "other": 0.1})
    gone = cpu_split({**before, "router": None}, after, 10.0)["cores_used"]
    assert gone["router"] is None and gone["other"] == pytest.approx(0.2)
    fleet = SimpleNamespace(workers=[SimpleNamespace(proc=SimpleNamespace(pid=os.getpid()))], router=None)
    now = cpu_seconds(fleet)
    assert now["worker0"] >= now["client"] > 0 and now["router"] is None and now["machine_busy"] > 0
