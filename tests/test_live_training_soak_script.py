"""benchmarks/soak/run.py and its soak/ helpers: percentiles per phase, error tallies, RSS growth, floors,
result assembly, fuzz replies, the counting proxy and option checks (no server is started here)."""

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from _scripts import load_benchmark

MOD = load_benchmark("soak")  # puts benchmarks/ on sys.path: the soak package imports below

from soak import fuzz, procs, proxy, stats  # noqa: E402
from sglang_specopd.app.bench.client import RequestRecord  # noqa: E402


def _rec(ok=True, error=None, ttft=0.1, times=(0.1, 0.3, 0.4), tokens=(1, 2, 1), latency=0.5):
    return RequestRecord(id="p", domain="math", ok=ok, error=error, start_s=0.0, latency_s=latency, ttft_s=ttft,
                         prompt_tokens=5, completion_tokens=sum(tokens) if ok else 0, chunk_times_s=tuple(times),
                         chunk_tokens=tuple(tokens), verify_ct=2, accept_length=2.0, histogram=(), finish_reason=None)


def test_classify_load_error_and_outcome():
    assert stats.classify_load_error("HTTP 503: overloaded") == "503"
    assert stats.classify_load_error("HTTP 429: busy") == "429"
    assert stats.classify_load_error("timeout after 300 s") == "timeout"
    assert stats.classify_load_error("stream ended before [DONE] (connection closed by the server)") == "stream_cut"
    assert stats.classify_load_error("error chunk: boom") == "error_chunk"
    assert stats.classify_load_error("malformed stream: ValueError: x") == "malformed"
    assert stats.classify_load_error("ConnectError: refused") == "connection"
    assert stats.load_outcome(_rec()) == (None, False)
    assert stats.load_outcome(_rec(ok=False, error="malformed stream: KeyError: 'x'")) == ("malformed", True)
    assert stats.load_outcome(_rec(ok=False, error="HTTP 500: x")) == ("500", False)
    assert stats.load_outcome(_rec(times=(), tokens=())) == (None, True)  # [DONE] without any token


def test_window_and_latency_summary():
    a, b = _rec(), _rec(times=(0.2, 0.6), tokens=(1, 4), ttft=0.2, latency=0.7)
    timed = [(10.0, a), (11.0, b), (19.8, _rec())]  # the last one ends at 20.3: outside [10, 20]
    inside = stats.in_window(timed, 10.0, 20.0)
    assert inside == [a, b]
    s = stats.latency_summary(inside + [_rec(ok=False, error="HTTP 500: x")])
    assert (s["requests"], s["failed"], s["output_tokens"]) == (3, 1, 9)
    # ITL values: a -> 0.2/2 twice, 0.1 once; b -> 0.4/4 four times: seven values, 0.1 everywhere
    assert s["itl_p50_s"] == pytest.approx(0.1) and s["itl_p99_s"] == pytest.approx(0.1)
    assert s["ttft_p50_s"] == pytest.approx(0.15)
    assert s["ttft_p99_s"] == pytest.approx(0.1 + 0.99 * 0.1)
    empty = stats.latency_summary([])
    assert empty["itl_p99_s"] is None and empty["requests"] == 0


def test_rss_growth_fraction():
    samples = [[0, 100.0], [5, 500.0], [60, 200.0], [65, 210.0], [120, 220.0], [200, 999.0]]
    # training [5, 130], warm-up 55 s: reference = last sample <= 60 (200), max after = 220
    assert stats.rss_growth_fraction(samples, 5, 130, 55) == pytest.approx(0.10)
    assert stats.rss_growth_fraction(samples, 5, 130, 58) == pytest.approx(0.10)
    # no sample in the warm-up: the first one after it is the reference
    assert stats.rss_growth_fraction([[70, 100.0], [80, 90.0]], 0, 100, 60) == pytest.approx(0.0)
    assert stats.rss_growth_fraction(samples, 130, 190, 10) is None  # nothing in the phase


def test_errors_merge_and_5xx():
    by_source = {"load": {"503": 2, "timeout": 1}, "trainer": {"429": 4, "500": 1}, "fuzzer": {"400": 7}}
    merged = stats.merge_errors(by_source)
    assert merged == {"400": 7, "429": 4, "500": 1, "503": 2, "timeout": 1}
    assert stats.count_5xx(merged) == 3
    assert stats.count_5xx({"5xx": 3, "50": 1, "599": 1}) == 1


def test_tally_threadsafe_counts():
    t = stats.Tally()
    t.add("load")
    t.add("fuzzer", "400", malformed=True)
    t.add("fuzzer", "400")
    snap = t.snapshot()
    assert snap["sent"] == {"load": 1, "trainer": 0, "fuzzer": 2}
    assert snap["errors"]["fuzzer"] == {"400": 2} and snap["malformed"]["fuzzer"] == 1
    assert stats.status_key(200) is None and stats.status_key(413) == "413"


def test_floors():
    ok = stats.check_floors(1.5, 0, 0.05, True)
    assert all(f["pass"] for f in ok.values())
    bad = stats.check_floors(2.5, 1, 0.11, False)
    assert not any(f["pass"] for f in bad.values())
    assert stats.check_floors(2.0, 0, 0.10, True)["itl_p99_ratio"]["pass"]  # limits are inclusive
    missing = stats.check_floors(None, 0, None, None)
    assert not missing["itl_p99_ratio"]["pass"] and not missing["rss_growth_fraction"]["pass"]
    assert not missing["greedy_probes_identical"]["pass"]


def _phase(itl99, ttft99):
    return {"requests": 10, "failed": 0, "output_tokens": 100, "itl_p50_s": itl99 / 2, "itl_p99_s": itl99,
            "ttft_p50_s": ttft99 / 2, "ttft_p99_s": ttft99}


def test_assemble_result_keys_and_floors():
    tally = {"sent": {"load": 20, "trainer": 9, "fuzzer": 6},
             "errors": {"load": {}, "trainer": {"429": 2}, "fuzzer": {"400": 5, "502": 1}},
             "malformed": {"load": 0, "trainer": 0, "fuzzer": 1}}
    res = stats.assemble_result(minutes=20.5, phases={"idle": _phase(0.1, 0.5), "training": _phase(0.15, 0.9)},
                                tally=tally, rss_mb=[[0.04, 100.04], [5.0, 101.0]], rss_growth=0.01, swaps=3,
                                probes_before=[[1, 2], [3]], probes_after=[[1, 2], [3]], scoring_budget=1024,
                                extra={"curve": []})
    for key in ("minutes", "errors_by_status", "errors_5xx", "malformed_responses", "itl_p99_s", "ttft_p99_s",
                "rss_mb", "rss_growth_fraction", "swaps", "fuzz_examples", "greedy_probes_identical",
                "scoring_budget", "itl_p50_s", "ttft_p50_s", "floors", "curve"):
        assert key in res
    assert res["errors_by_status"] == {"400": 5, "429": 2, "502": 1}
    assert res["errors_by_source"]["trainer"] == {"429": 2}
    assert res["errors_5xx"] == 1 and res["malformed_responses"] == 1 and res["fuzz_examples"] == 6
    assert res["itl_p99_s"] == {"idle": 0.1, "training": 0.15} and res["ttft_p99_s"]["training"] == 0.9
    assert res["itl_p99_ratio"] == pytest.approx(1.5)
    assert res["rss_mb"] == [[0.0, 100.0], [5.0, 101.0]]
    assert res["greedy_probes_identical"] is True
    assert res["floors"]["errors_5xx"]["pass"] is False and res["floors_pass"] is False
    json.dumps(res)  # serialisable as is
    diff = stats.assemble_result(minutes=1, phases={"idle": _phase(0.1, 0.5), "training": _phase(0.1, 0.5)},
                                 tally={**tally, "errors": {}}, rss_mb=[], rss_growth=0.0, swaps=0,
                                 probes_before=[[1, 2]], probes_after=[[1, 3]], scoring_budget=0)
    assert diff["greedy_probes_identical"] is False and diff["errors_5xx"] == 0
    assert stats.assemble_result(minutes=1, phases={"idle": _phase(0.1, 0.5), "training": _phase(0.1, 0.5)},
                                 tally=tally, rss_mb=[], rss_growth=0.0, swaps=0, probes_before=[],
                                 probes_after=[], scoring_budget=0)["greedy_probes_identical"] is False


def test_fuzz_cases_are_invalid_and_replies_checked():
    from pydantic import ValidationError

    from sglang_specopd.wire.protocol import SCORE_TREES_PATH, ScoreTreesRequest, request_from_binary

    rng = random.Random(0)
    kinds = set()
    for _ in range(300):
        case = fuzz.make_case(rng)
        kinds.add(case.kind)
        assert case.body
        if case.kind == "score_trees_small_valid":  # the one valid kind: its queue wait is measured
            assert ScoreTreesRequest.model_validate_json(case.body).references[0].input_ids == [1, 2, 3, 4]
        elif case.path == SCORE_TREES_PATH and case.kind not in ("score_trees_bad_values",
                                                                  "score_trees_nan_or_duplicate"):
            with pytest.raises((ValueError, ValidationError)):  # never a request the server could accept
                if case.content_type == fuzz.JSON_TYPE:
                    ScoreTreesRequest.model_validate_json(case.body)
                else:
                    request_from_binary(case.body)
        elif case.kind in ("score_trees_deep_nesting", "swap_deep_nesting", "score_trees_nan_or_duplicate"):
            from sglang_specopd.wire.strict_json import JSONBodyError, loads

            with pytest.raises(JSONBodyError):  # refused by the server's strict JSON parse
                loads(case.body)
    assert len(kinds) == 15
    m = fuzz.response_malformed
    assert not m(SCORE_TREES_PATH, 400, "application/json", b'{"error": {"code": 400, "message": "bad"}}')
    assert not m("/specopd/drafter/swap", 401, "application/json", b'{"error": "Unauthorized"}')
    assert m(SCORE_TREES_PATH, 400, "application/json", b'{"detail": "x"}')  # not the plugin's error shape
    assert m(SCORE_TREES_PATH, 400, "text/plain", b"Internal Server Error")
    assert not m("/generate", 422, "application/json", b'{"detail": [{"loc": ["body"]}]}')
    assert m("/generate", 400, "application/json", b"[1, 2]")
    assert not m("/generate", 200, "application/json", b'{"text": "hi", "output_ids": [1]}')
    with pytest.raises(ValueError):
        fuzz.Fuzzer("http://x", "k", 0, lambda k, b: None)


def test_queue_wait_summary():
    waits = [(1.0, 0.0, 200), (2.0, 0.5, 200), (3.0, 2.0, 200), (4.0, 10.0, 429), (50.0, 99.0, 200)]
    s = stats.queue_wait_summary(waits, 0.0, 10.0)
    assert s["score_queue_waits"] == 4 and s["score_queue_429"] == 1 and s["score_queue_wait_max_s"] == 10.0
    assert s["score_queue_wait_p50_s"] == pytest.approx(1.25)
    assert s["score_queue_wait_p99_s"] == pytest.approx(2.0 + 0.97 * 8.0)
    empty = stats.queue_wait_summary([], 0.0, 10.0)
    assert empty["score_queue_wait_p99_s"] is None and empty["score_queue_waits"] == 0
    assert proxy.queue_wait_of("0.125") == 0.125
    assert [proxy.queue_wait_of(v) for v in (None, "x", "-1", "inf", "nan")] == [None] * 5


def test_proxy_reply_checks_and_forwarding():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    import httpx

    from sglang_specopd.wire.protocol import SCORE_TREES_PATH, SWAP_DRAFTER_PATH, encode_tensors

    import torch

    good = encode_tensors({"x": torch.zeros(2)}, {"references": []})
    assert not proxy.reply_malformed(SCORE_TREES_PATH, 200, "application/octet-stream", good)
    assert proxy.reply_malformed(SCORE_TREES_PATH, 200, "application/octet-stream", good[:20])
    assert proxy.reply_malformed(SCORE_TREES_PATH, 200, "application/json", b"{}")
    assert proxy.reply_malformed(SWAP_DRAFTER_PATH, 200, "application/json", b'{"swaps": 1}')
    assert not proxy.reply_malformed(SWAP_DRAFTER_PATH, 200, "application/json", b'{"version": "v1"}')
    assert not proxy.reply_malformed(SCORE_TREES_PATH, 503, "text/plain", b"busy")

    class Upstream(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = 200 if self.path == SWAP_DRAFTER_PATH else 503
            out = json.dumps({"version": body.decode(), "auth": self.headers.get("Authorization")}).encode()
            self.send_response(status)
            if self.path == SCORE_TREES_PATH:
                self.send_header("X-SpecOPD-Queue-Wait-S", "1.500")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    up = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    seen = []
    ticks = iter([1.0, 2.0, 3.0])
    try:
        with proxy.CountingProxy(f"http://127.0.0.1:{up.server_address[1]}", lambda k, m: seen.append((k, m)),
                                 lambda: next(ticks)) as p:
            r = httpx.post(p.url + SWAP_DRAFTER_PATH, content=b"v7", headers={"Authorization": "Bearer k"})
            assert r.status_code == 200 and r.json() == {"version": "v7", "auth": "Bearer k"}
            r = httpx.post(p.url + SCORE_TREES_PATH, content=b"{}", headers={"Content-Type": "application/json"})
            assert r.status_code == 503
    finally:
        up.shutdown()
        up.server_close()
    assert seen == [(None, False), ("503", False)]
    assert p.swap_times_s == [1.0] and p.first_score_s == 2.0
    assert p.score_waits == [(3.0, 1.5, 503)]


def test_trainer_command_and_metrics(tmp_path: Path):
    cmd = procs.trainer_command("http://127.0.0.1:1", "key", tmp_path / "data", tmp_path / "run", minutes=2.5,
                                push_every=8, extra=["--anchors", "4"])
    assert cmd[1:5] == ["-m", "sglang_specopd.app.cli", "train", "specopd"]
    joined = " ".join(cmd)
    for part in ("--server http://127.0.0.1:1", "--admin-key key", f"--data {tmp_path / 'data'}",
                 "--max-minutes 2.5", "--push-every 8", "--anchors 4"):
        assert part in joined
    assert procs.trainer_metrics(tmp_path)["supervised_tokens"] == 0
    rows = [{"step": 1, "supervised_tokens": 100, "supervised_tokens_per_s": 10.0, "supervised_wall_s": 10.0},
            {"step": 2, "supervised_tokens": 300, "supervised_tokens_per_s": 15.0, "supervised_wall_s": 20.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert procs.trainer_metrics(tmp_path) == {"steps": 2, "supervised_tokens": 300,
                                               "supervised_tokens_per_s": 15.0, "supervised_wall_s": 20.0}


def test_parse_cores_budgets_and_pinning():
    assert procs.parse_cores("0") == {0} and procs.parse_cores("1,3-4") == {1, 3, 4}
    with pytest.raises(ValueError):
        procs.parse_cores(" , ")
    assert MOD.parse_budgets("256,1024,0") == [256, 1024, 0] and MOD.parse_budgets("") == []
    with pytest.raises(MOD.SoakError, match="comma list"):
        MOD.parse_budgets("256,lots")
    with pytest.raises(MOD.SoakError, match=">= 0"):
        MOD.parse_budgets("-1")
    args = SimpleNamespace(no_pin=True, server_cores="0", client_cores="1")
    assert MOD.pinning(args) == (None, None)
    import os

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) >= 2:
        args = SimpleNamespace(no_pin=False, server_cores=str(allowed[0]), client_cores=str(allowed[0]))
        with pytest.raises(MOD.SoakError, match="disjoint"):
            MOD.pinning(args)
        args.client_cores = str(allowed[1])
        assert MOD.pinning(args) == ({allowed[0]}, {allowed[1]})


def test_missing_budget_key_fails_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(MOD, "budget_key_supported", lambda: False)  # a checkout without the key
    assert MOD.main(["--minutes", "1", "--curve-budgets", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("live_training_soak: server config key 'score_trees_budget_tokens' does not exist")
    assert "\n" not in err


def test_bad_options_fail_before_anything_starts(capsys):
    assert MOD.main(["--minutes", "1", "--idle-minutes", "2", "--curve-budgets", ""]) == 2
    assert "--idle-minutes 2 must be in (0, --minutes 1)" in capsys.readouterr().err
    assert MOD.main(["--minutes", "1", "--curve-budgets", "1,x"]) == 2
    assert "--curve-budgets '1,x'" in capsys.readouterr().err


def test_serve_config_sets_the_budget():
    if not MOD.budget_key_supported():
        pytest.skip("ServeConfig has no score_trees_budget_tokens in this checkout")
    cfg, budget = MOD.serve_config("cpu-smollm2-fp32", 256)
    assert budget == 256 and cfg.score_trees_budget_tokens == 256 and cfg.dtype == "float32"
    base, default = MOD.serve_config("cpu-smollm2-fp32", None)
    assert default == base.score_trees_budget_tokens
    with pytest.raises(MOD.SoakError, match="score_trees_budget_tokens=-5"):
        MOD.serve_config("cpu-smollm2-fp32", -5)
