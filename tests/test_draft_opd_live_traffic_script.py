"""benchmarks/live_traffic/run.py and its live_traffic/ helpers: reply parsing, the traffic generator against
a stub server, tau per window and per span, the unpaired before/after interval, the trainer summary, result
assembly, the held-out comparison, the plot, option checks; and one short end-to-end run on the tiny target
(real SPECOPD server with a traffic spool + `specopd train draft-opd --from-traffic`)."""

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from _scripts import load_benchmark, tiny_specopd_config
from fakes.http_stub import stub_server

MOD = load_benchmark("live_traffic")  # puts benchmarks/ on sys.path: the helper packages below

from live_traffic import load, session, stats  # noqa: E402
from live_traffic.load import ServedRequest  # noqa: E402
from sglang_specopd.app.bench.client import BenchPrompt  # noqa: E402


def req(done, comp=10, ver=4, domain="math", error=None, versions=("v0",), sent=None, seq=0):
    return ServedRequest(seq=seq, id=f"p{seq}", domain=domain, sent_s=done - 1.0 if sent is None else sent,
                         done_s=done, status=200 if error is None else None, error=error, prompt_tokens=5,
                         completion_tokens=comp if error is None else 0, verify_ct=ver if error is None else 0,
                         accept_length=comp / ver if error is None and ver else None,
                         versions=versions if error is None else ())


def test_interleave_is_round_robin_and_seeded():
    ps = [BenchPrompt(f"{d}{i}", d, (i,)) for d, n in (("a", 3), ("b", 1), ("c", 2)) for i in range(n)]
    ps.append(BenchPrompt("z0", "z", (0,)))  # not a requested domain: left out
    out = load.interleave(ps, ["a", "b", "c", "empty"], seed=0)
    assert [p.domain for p in out] == ["a", "b", "c"] * 3  # the same mix in every round; short domains repeat
    assert sorted(p.id for p in out[0::3]) == ["a0", "a1", "a2"] and {p.id for p in out[1::3]} == {"b0"}
    assert out[2] != out[5] and out[8] == out[2] and {out[2].id, out[5].id} == {"c0", "c1"}  # c's prompts in turn
    assert out == load.interleave(ps, ["a", "b", "c"], seed=0)
    orders = {tuple(p.id for p in load.interleave(ps, ["a", "b", "c"], seed=s)) for s in range(10)}
    assert len(orders) > 1  # the seed shuffles within a domain


def test_parse_reply():
    p = BenchPrompt("x", "math", (1, 2, 3))
    ok = load.parse_reply(3, p, 1.0, 2.5, 200, {"meta_info": {"completion_tokens": 12, "spec_verify_ct": 5,
                                                              "spec_accept_length": 2.4,
                                                              "specopd_drafter_versions": ["a", "b"]}})
    assert ok.ok and (ok.completion_tokens, ok.verify_ct, ok.accept_length) == (12, 5, 2.4)
    assert ok.versions == ("a", "b") and ok.prompt_tokens == 3 and ok.seq == 3
    one = load.parse_reply(0, p, 0, 1, 200, {"meta_info": {"completion_tokens": 1}})  # prefill token only
    assert one.ok and one.verify_ct == 0 and one.versions == ()
    assert load.parse_reply(0, p, 0, 1, 503, {"error": "busy"}).error == "503"
    assert load.parse_reply(0, p, 0, 1, 200, None).error == "malformed"
    assert load.parse_reply(0, p, 0, 1, 200, {"meta_info": {"completion_tokens": "7"}}).error == "malformed"
    assert load.parse_reply(0, p, 0, 1, None, None, "timeout").error == "timeout"
    assert load.parse_reply(0, p, 0, 1, None, None).error == "connection"
    body = load.generate_body(p, 96, 0.0, 7)
    assert body == {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 96, "temperature": 0.0}}
    hot = [load.generate_body(p, 96, 1.0, s)["sampling_params"]["sampling_seed"] for s in (1, 2)]
    assert hot[0] != hot[1]  # each repeat of a prompt gets its own seed


def test_traffic_generator_against_a_stub_server():
    calls, lock = [], threading.Lock()

    def reply(path, body):
        assert path == "/generate"
        with lock:
            calls.append(body["input_ids"])
            n = len(calls)
        return (503, {"error": "x"}) if n == 3 else (200, {"meta_info": {
            "completion_tokens": 6, "spec_verify_ct": 2, "specopd_drafter_versions": ["v1"]}})

    prompts = [BenchPrompt("a", "math", (1,)), BenchPrompt("b", "coding", (2,))]
    done = []
    with stub_server(reply) as url:
        gen = load.TrafficGenerator(url, prompts, concurrency=2, max_new_tokens=8, temperature=0.0,
                                    clock=lambda: 0.0, on_done=done.append).start()
        for _ in range(200):
            if len(gen.snapshot()) >= 6:
                break
            threading.Event().wait(0.01)
        gen.stop()
    recs = gen.snapshot()
    assert len(recs) == len(calls) == gen.sent >= 6 and sorted(r.seq for r in done) == sorted(r.seq for r in recs)
    assert sorted(r.seq for r in recs) == list(range(len(recs)))
    assert [r.error for r in recs].count("503") == 1
    served = [r for r in recs if r.ok]
    assert all(r.completion_tokens == 6 and r.verify_ct == 2 and r.versions == ("v1",) for r in served)
    assert {c[0] for c in calls} == {1, 2}
    for bad in ({"concurrency": 0, "max_new_tokens": 8}, {"concurrency": 1, "max_new_tokens": 0}):
        with pytest.raises(ValueError):
            load.TrafficGenerator("http://x", prompts, temperature=0, clock=float, **bad)


def test_windows_spans_and_versions():
    recs = [req(10, 10, 4, seq=0), req(30, 6, 2, domain="coding", seq=1, versions=("v0", "v1")),
            req(59.9, 3, 3, seq=2, versions=("v1",)), req(60, 9, 3, seq=3, versions=("v1",)),
            req(70, error="503", seq=4), req(75, 1, 0, seq=5, versions=("v1",)), req(130, 8, 2, seq=6)]
    rows = stats.window_taus(recs, 60, 125)
    assert [(w["t0_s"], w["t1_s"]) for w in rows] == [(0, 60), (60, 120), (120, 125)]
    # window 0: (10 + 6 + 3) / (4 + 2 + 3); window 1: 9 / 3 (the prefill-only request counts as served, not in tau)
    assert rows[0]["tau"] == pytest.approx(19 / 9) and rows[0]["requests"] == 3
    assert rows[0]["versions"] == {"mixed": 1, "v0": 1, "v1": 1}
    assert rows[1]["tau"] == pytest.approx(3.0) and rows[1]["requests"] == 2 and rows[1]["errors"] == 1
    assert rows[2]["tau"] is None and rows[2]["requests"] == 0  # the request at 130 s is past the end
    span = stats.span_summary(recs, 0, 60)
    assert span["tau"] == pytest.approx(19 / 9) and span["tau_by_domain"]["coding"] == pytest.approx(3.0)
    assert span["tau_by_domain"]["dialogue"] is None and span["latency_p50_s"] == pytest.approx(1.0)
    assert stats.span_summary(recs, 60, 125)["errors"] == {"503": 1}
    byv = stats.tau_by_version(recs)
    assert set(byv) == {"v0", "v1"}
    assert byv["v0"]["tau"] == pytest.approx(18 / 6) and byv["v1"]["tau"] == pytest.approx(12 / 6)
    assert stats.errors_by_status(recs + [req(1, error="timeout")]) == {"503": 1, "timeout": 1}
    with pytest.raises(ValueError):
        stats.window_taus(recs, 0, 10)


def test_tau_difference_unpaired_bootstrap():
    before = [req(t, comp=10 + (t % 3), ver=5, seq=t) for t in range(40)]
    same = stats.tau_difference(before, before)
    assert same["mean"] == pytest.approx(0.0) and same["inside_noise"] is True
    after = [req(t, comp=15 + (t % 3), ver=5, seq=t) for t in range(40)]
    up = stats.tau_difference(after, before)
    assert up["mean"] == pytest.approx(1.0) and up["inside_noise"] is False
    assert up["ci95"][0] > 0.8 and up["ci95"][1] < 1.2
    assert stats.tau_difference([], before) is None


def test_trainer_summary(tmp_path: Path):
    assert stats.trainer_summary(tmp_path) == {"steps": 0}
    rows = [{"step": 1, "wall_s": 10.0, "loss": 2.0, "rollout_tau": 3.0, "est_tau": 3.5, "records": 40, "blocks": 30,
             "stale_records": 5, "supervised_tokens": 100, "supervised_tokens_per_s": 10.0},
            {"step": 2, "wall_s": 20.0, "loss": 1.0, "rollout_tau": 3.4, "est_tau": 3.7, "records": 20, "blocks": 10,
             "stale_records": 0, "supervised_tokens": 180, "supervised_tokens_per_s": 9.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = stats.trainer_summary(tmp_path)
    assert s["steps"] == 2 and s["loss"] == {"first": 2.0, "last": 1.0, "mean": 1.5}
    assert s["rollout_tau"]["last"] == 3.4 and s["est_tau"]["mean"] == pytest.approx(3.6)
    assert (s["total_records"], s["total_blocks"], s["total_stale_records"]) == (60, 40, 5)
    assert s["supervised_tokens"] == 180 and s["supervised_tokens_per_s"] == 9.0
    assert s["per_step"] == [[1, 10.0, 2.0, 3.0, 3.5], [2, 20.0, 1.0, 3.4, 3.7]]


def test_assemble_result():
    recs = [req(t, comp=8, ver=4, seq=t) for t in range(0, 120, 10)]  # tau 2 during the warm-up
    recs += [req(t, comp=12, ver=4, seq=t) for t in range(120, 600, 10)]  # then tau 3
    recs += [req(300, error="503", seq=999), req(610, comp=5, ver=1, seq=1000)]  # one error; one past the end
    res = stats.assemble_result(records=recs, end_s=600.0, warmup_s=120.0, after_s=180.0, window_s=60.0,
                                push_times_s=[150.0, 300.0, 605.0], trainer={"steps": 4},
                                extra={"drafter": {"path": "/d"}})
    live = res["live_traffic"]
    assert set(live) == {"minutes", "tau_before", "tau_after", "pushes", "serving_errors", "requests_served"}
    assert live["minutes"] == 10.0 and live["tau_before"] == pytest.approx(2.0)
    assert live["tau_after"] == pytest.approx(3.0) and live["pushes"] == 2  # the push at 605 s is after the end
    assert live["serving_errors"] == 1 and live["requests_served"] == len(recs) - 1
    assert res["errors_by_status"] == {"503": 1} and len(res["windows"]) == 10
    assert res["windows"][0]["tau"] == pytest.approx(2.0) and res["windows"][-1]["tau"] == pytest.approx(3.0)
    assert res["tau_change"]["mean"] == pytest.approx(1.0) and res["tau_change"]["inside_noise"] is False
    assert res["before"]["end_s"] == 120.0 and res["after"]["start_s"] == 420.0
    assert res["push_times_s"] == [150.0, 300.0, 605.0] and res["trainer"] == {"steps": 4}
    assert res["drafter"] == {"path": "/d"} and "paired" in res["note"]
    json.dumps(res)
    with pytest.raises(ValueError):
        stats.assemble_result(records=recs, end_s=100.0, warmup_s=120.0, after_s=10.0, window_s=60.0,
                              push_times_s=[], trainer={})


def _eval(taus):
    rows = [{"id": f"{d}{i}", "domain": d, "completion_tokens": int(10 * t), "verify_steps": 10}
            for d, t in taus.items() for i in range(5)]
    return {"per_request": rows, "limit": 5, "temperature": 0.0, "max_new_tokens": 96}


def test_heldout_comparison_is_paired():
    domains = ("math", "coding")
    out = stats.heldout_comparison(_eval({"math": 2.0, "coding": 3.0}), _eval({"math": 2.5, "coding": 3.5}), domains)
    assert out["initial"]["mean"] == pytest.approx(2.5) and out["final"]["mean"] == pytest.approx(3.0)
    assert out["paired_difference"]["mean"] == pytest.approx(0.5)
    assert out["paired_difference"]["prompts"] == {"math": 5, "coding": 5} and out["prompts_per_domain"] == 5
    missing = stats.heldout_comparison(_eval({"math": 2.0}), _eval({"math": 2.0}), domains)
    assert "coding" in missing["initial"]["error"] and "error" in missing["paired_difference"]


def test_plot_writes_a_png(tmp_path: Path):
    recs = [req(t, comp=8 + (t > 100), ver=4, seq=t) for t in range(0, 300, 7)]
    res = stats.assemble_result(records=recs, end_s=300.0, warmup_s=60.0, after_s=60.0, window_s=60.0,
                                push_times_s=[90.0, 200.0], trainer={})
    from live_traffic.plot import save_plot

    out = save_plot(res, tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trainer_command_and_minutes(tmp_path: Path):
    cmd = session.draft_opd_command("http://127.0.0.1:1", "key", tmp_path / "run", minutes=11.5, push_every=2,
                                    traffic_items=32, max_blocks=64, lr=1e-4, traffic_wait_s=120,
                                    extra=["--push-every", "3"])
    assert cmd[1:5] == ["-m", "sglang_specopd.app.cli", "train", "draft-opd"]
    joined = " ".join(cmd)
    for part in ("--server http://127.0.0.1:1", "--admin-key key", "--from-traffic", f"--run-dir {tmp_path / 'run'}",
                 "--max-minutes 11.5", "--push-every 2", "--traffic-items 32", "--max-blocks 64", "--lr 0.0001",
                 "--traffic-wait-s 120", "--no-progress"):
        assert part in joined
    assert cmd[-2:] == ["--push-every", "3"]  # extra options come last (they win)
    args = SimpleNamespace(minutes=15.0, warmup_minutes=2.0, trainer_startup_minutes=1.0)
    assert session.trainer_minutes(args) == 12.0


def test_bad_options_fail_before_anything_starts(tmp_path: Path, capsys):
    d = tmp_path / "drafter"
    d.mkdir()
    cases = [(["--drafter", str(tmp_path / "nope")], "not a directory"),
             (["--drafter", str(d), "--minutes", "2", "--warmup-minutes", "2"], "--warmup-minutes 2 must be in"),
             (["--drafter", str(d), "--minutes", "5", "--warmup-minutes", "2", "--after-minutes", "4"],
              "--after-minutes 4 must be in (0, --minutes - --warmup-minutes = 3]"),
             (["--drafter", str(d), "--minutes", "3", "--warmup-minutes", "2", "--after-minutes", "1"],
              "no training time left"),
             (["--drafter", str(d), "--spool-mb", "0"], "the traffic spool must be on"),
             (["--drafter", str(d), "--config", "cpu-smollm2-plain"], "only a SPECOPD server records")]
    for argv, msg in cases:
        assert MOD.main(argv + ["--out", str(tmp_path / "r.json")]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "\n" not in err.strip(), (argv, err)
    assert not (tmp_path / "r.json").exists()


def test_serve_config_sets_drafter_and_spool(tmp_path: Path):
    cfg = MOD.serve_config("cpu-smollm2", str(tmp_path), 64)
    assert cfg.traffic_spool_mb == 64 and cfg.drafter == str(tmp_path.resolve())
    assert cfg.dtype == "auto" and cfg.speculative_algorithm == "SPECOPD"
    with pytest.raises(MOD.LiveTrafficError, match="traffic_spool_mb=-1"):
        MOD.serve_config("cpu-smollm2", str(tmp_path), -1)


@pytest.mark.server
def test_end_to_end_on_the_tiny_target(tiny_serving_target: Path, tiny_drafter: Path, tmp_path: Path):
    """~2-3 min: tiny fp32 SPECOPD server, 2 requests in flight for 1.5 min, the trainer after 0.4 min."""
    from sglang_specopd.app.launch.process import free_port

    cfg = tiny_specopd_config(tmp_path / "tiny.yaml", tiny_serving_target, tiny_drafter, "tiny-live-traffic")
    out = tmp_path / "result.json"
    rc = MOD.main(["--drafter", str(tiny_drafter), "--config", str(cfg), "--spool-mb", "8", "--minutes", "1.5",
                   "--warmup-minutes", "0.4", "--after-minutes", "0.4", "--window-s", "20", "--concurrency", "2",
                   "--max-new-tokens", "16", "--max-prompt-tokens", "256", "--push-every", "1",
                   "--traffic-items", "16", "--max-blocks", "16", "--traffic-wait-s", "60",
                   "--trainer-startup-minutes", "0.5", "--trainer-grace-s", "240", "--no-pin", "--port",
                   str(free_port()), "--run-dir", str(tmp_path / "run"), "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    live = res["live_traffic"]
    assert live["serving_errors"] == 0 and live["requests_served"] > 0, res["errors_by_status"]
    assert live["tau_before"] is not None and live["tau_after"] is not None
    assert 1.0 <= live["tau_before"] <= 4.0
    trainer = res["trainer"]
    assert trainer["exit_code"] == 0 and trainer["steps"] >= 1, (tmp_path / "run" / "train.log").read_text()[-2000:]  # the file keeps a portable path
    assert res["drafter"]["swaps"] >= 2 and res["drafter"]["version_after"].startswith("draftopd-")
    assert len(res["push_times_s"]) == res["drafter"]["swaps"]
    assert res["trainer"]["statuses"].get("500") is None
    versions = {v for w in res["windows"] for v in w["versions"]}
    assert any(v.startswith("draftopd-") for v in versions) or "mixed" in versions  # pushed drafters served
    assert res["spool"]["stats_at_end"]["recorded"] >= live["requests_served"]
    assert out.with_suffix(".png").is_file()
    assert (tmp_path / "run" / "requests.jsonl").read_text().count("\n") == res["requests_sent"]
