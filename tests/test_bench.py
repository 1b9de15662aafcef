"""Serving benchmark and report (sglang_specopd/app/bench, ``specopd bench``).

Most tests run against fake OpenAI-streaming servers (a threaded HTTP/1.1 server in this file that streams
scripted SSE chunks, or drops the connection, or hangs), so the numbers are known exactly. One test launches a
tiny real SPECOPD server and its plain baseline through the benchmark's own launcher and checks SGLang's
per-request statistics (histogram sums to the verify count, tau = completion tokens / verify steps).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

from sglang_specopd.app.bench import BenchError
from sglang_specopd.app.bench.client import BenchPrompt, RequestParams, RequestRecord, run_level
from sglang_specopd.app.bench.metrics import (acceptance, itl_values, padded_histogram, percentile, speedup,
                                          summarize_level, tpot)

# A speculative request as a fake server streams it: prefill token, then verify steps of 3, 2 and 4 tokens.
CHUNKS = (1, 3, 2, 4)
SPEC_DETAILS = {"spec_verify_ct": 3, "spec_accept_length": 10 / 3, "spec_correct_drafts_histogram": [0, 1, 1, 1]}
GAP_S = 0.03


# ----------------------------------------------------------------------------------------------------------------
# Fake OpenAI streaming server
# ----------------------------------------------------------------------------------------------------------------


class FakeServer:
    """What the fake server does per completion request: ``mode(n)`` for the n-th request (0-based) is one of
    ``ok`` (scripted stream + [DONE]), ``drop`` (two chunks, then the connection is cut), ``reset`` (closed
    before any response), ``hang`` (no response until the server stops)."""

    def __init__(self, mode: Callable[[int], str], spec: Optional[dict] = SPEC_DETAILS):
        self.mode, self.spec = mode, spec
        self.bodies: List[dict] = []
        self.flushes = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()


@contextlib.contextmanager
def fake_server(fake: FakeServer) -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _json(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            info = {"model_path": "/fake/target", "speculative_algorithm": "SPECOPD" if fake.spec else None,
                    "speculative_dflash_block_size": 4 if fake.spec else None}
            self._json(info if self.path == "/server_info" else {})

        def _chunk(self, obj) -> None:
            data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _cut(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/flush_cache":
                fake.flushes += 1
                return self._json({})
            with fake.lock:
                n = len(fake.bodies)
                fake.bodies.append(body)
            mode = fake.mode(n)
            if mode == "reset":
                return self._cut()
            if mode == "hang":
                fake.stop.wait(30)
                return self._cut()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            total = 0
            for k, n_tok in enumerate(CHUNKS):
                if mode == "drop" and k == 2:
                    return self._cut()
                time.sleep(GAP_S)
                total += n_tok
                if self.path == "/generate":  # SGLang's native stream: cumulative meta_info, spec stats at the end
                    last = k == len(CHUNKS) - 1
                    meta = {"prompt_tokens": 7, "completion_tokens": total,
                            "finish_reason": {"type": "length", "length": total} if last else None}
                    self._chunk({"text": "ab" * total, "meta_info": meta | (fake.spec if last and fake.spec else {})})
                    continue
                self._chunk({"choices": [{"index": 0, "text": "ab" * n_tok,
                                          "finish_reason": "length" if k == len(CHUNKS) - 1 else None}],
                             "usage": {"prompt_tokens": 7, "completion_tokens": total, "total_tokens": 7 + total}})
            if fake.spec and self.path != "/generate":
                self._chunk({"choices": [], "sglext": {"spec_tokens_details": fake.spec}})
            if self.path != "/generate":
                self._chunk({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": total}})
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        fake.stop.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def prompts(n: int) -> List[BenchPrompt]:
    domains = ("dialogue", "coding", "math", "agentic")
    return [BenchPrompt(f"p{i}", domains[i % 4], tuple(range(3, 10 + i))) for i in range(n)]


# ----------------------------------------------------------------------------------------------------------------
# Client + metrics against the fake server
# ----------------------------------------------------------------------------------------------------------------


def test_stream_records_and_level_summary_on_fake_server() -> None:
    fake = FakeServer(lambda n: "ok")
    params = RequestParams(max_new_tokens=10, temperature=1.0)
    with fake_server(fake) as url:
        run = run_level(url, prompts(6), 3, params, timeout_s=20)
    assert len(fake.bodies) == 6
    body = next(b for b in fake.bodies if b["prompt"] == list(range(3, 10)))
    assert body["stream"] is True and body["return_spec_tokens_details"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == 10 and body["temperature"] == 1.0 and body["top_k"] == -1
    assert isinstance(body["seed"], int)
    for rec in run.records:
        assert rec.ok and rec.error is None
        assert rec.chunk_tokens == CHUNKS and rec.completion_tokens == 10 and rec.prompt_tokens == 7
        assert rec.verify_ct == 3 and rec.histogram == (0, 1, 1, 1) and rec.finish_reason == "length"
        assert rec.ttft_s == rec.chunk_times_s[0] >= GAP_S * 0.9
        assert rec.latency_s >= rec.chunk_times_s[-1] >= 4 * GAP_S * 0.9
        assert len(itl_values(rec)) == 9
    assert [r.id for r in run.records] == [p.id for p in prompts(6)]
    s = summarize_level(run.records, run.duration_s, speculative=True, block_size=4)
    assert (s["requests"], s["completed"], s["errors"], s["output_tokens"]) == (6, 6, 0, 60)
    assert s["output_tokens_per_s"] == pytest.approx(60 / run.duration_s)
    assert s["verify_ct"] == 18 and s["histogram_steps"] == 18
    assert s["acceptance_histogram"] == [0, 6, 6, 6, 0]  # buckets 0..block_size
    assert s["mean_acceptance_length"] == pytest.approx(60 / 18)
    assert s["acceptance_per_domain"]["dialogue"] == pytest.approx(10 / 3)


def test_generate_api_streams_the_same_records_from_sglangs_native_route() -> None:
    fake = FakeServer(lambda n: "drop" if n == 1 else "ok")
    params = RequestParams(max_new_tokens=10, temperature=1.0, ignore_eos=True)
    with fake_server(fake) as url:
        run = run_level(url, prompts(3), 1, params, timeout_s=20, api="generate")
        with pytest.raises(ValueError, match="api must be one of"):
            run_level(url, prompts(1), 1, params, api="chat")
    body = fake.bodies[0]
    assert body["input_ids"] == list(range(3, 10)) and body["stream"] is True
    sp = body["sampling_params"]
    assert sp["max_new_tokens"] == 10 and sp["temperature"] == 1.0 and sp["top_k"] == -1 and sp["ignore_eos"] is True
    assert isinstance(sp["sampling_seed"], int)
    ok, dropped = [run.records[0], run.records[2]], run.records[1]
    for rec in ok:
        assert rec.ok and rec.chunk_tokens == CHUNKS and rec.completion_tokens == 10 and rec.prompt_tokens == 7
        assert rec.verify_ct == 3 and rec.histogram == (0, 1, 1, 1) and rec.finish_reason == "length"
        assert rec.accept_length == pytest.approx(10 / 3) and len(itl_values(rec)) == 9
    assert not dropped.ok and "RemoteProtocolError" in dropped.error and dropped.chunk_tokens == (1, 3)


def test_metrics_exact_on_constructed_records() -> None:
    def rec(i, domain, times, toks, verify, hist, ok=True, latency=None):
        return RequestRecord(id=f"r{i}", domain=domain, ok=ok, error=None if ok else "boom", start_s=0.0,
                             latency_s=latency if latency is not None else (times[-1] if times else 1.0),
                             ttft_s=times[0] if times else None, prompt_tokens=5, completion_tokens=sum(toks),
                             chunk_times_s=tuple(times), chunk_tokens=tuple(toks), verify_ct=verify,
                             accept_length=sum(toks) / verify if verify else None, histogram=tuple(hist),
                             finish_reason="length")

    a = rec(0, "math", [0.5, 0.9, 1.5], [1, 2, 3], 2, [0, 1, 1])      # ITL: 0.2, 0.2, 0.2, 0.2, 0.2
    b = rec(1, "coding", [0.2, 0.6], [1, 4], 1, [0, 0, 0, 1], latency=0.7)  # ITL: 0.1 x4
    c = rec(2, "coding", [0.3], [1], None, [])                          # ended with the prefill token
    d = rec(3, "math", [0.1, 0.2], [1, 1], None, [], ok=False)           # failed: excluded everywhere
    assert itl_values(a) == pytest.approx([0.2] * 5) and itl_values(b) == pytest.approx([0.1] * 4)
    assert tpot(a) == pytest.approx((1.5 - 0.5) / 5) and tpot(b) == pytest.approx(0.5 / 4) and tpot(c) is None
    s = summarize_level([a, b, c, d], 2.0, speculative=True, block_size=4)
    assert (s["completed"], s["errors"], s["output_tokens"]) == (3, 1, 12)
    assert s["error_messages"] == ["r3: boom"]
    assert s["output_tokens_per_s"] == pytest.approx(6.0) and s["requests_per_s"] == pytest.approx(1.5)
    assert s["ttft_p50_s"] == pytest.approx(0.3) and s["ttft_mean_s"] == pytest.approx(1.0 / 3)
    assert s["ttft_p90_s"] == pytest.approx(0.3 + 0.8 * 0.2)
    assert s["itl_p50_s"] == pytest.approx(0.2) and s["itl_mean_s"] == pytest.approx(1.4 / 9)
    assert s["e2e_latency_p50_s"] == pytest.approx(0.7)
    assert s["verify_ct"] == 3 and s["acceptance_histogram"] == [0, 1, 1, 1, 0] and s["histogram_steps"] == 3
    assert s["mean_acceptance_length"] == pytest.approx(12 / 3)
    assert s["acceptance_per_domain"] == {"coding": pytest.approx(6 / 1), "math": pytest.approx(6 / 2)}
    assert s["spec_stats_missing"] == 0 and s["verify_step_p50_s"] == pytest.approx((0.5 + 0.5) / 2)
    missing = rec(4, "math", [0.1, 0.3], [1, 2], None, [])
    assert acceptance([missing])["spec_stats_missing"] == 1
    assert percentile([], 50) is None and percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert padded_histogram([[1, 2], [0, 0, 5]]) == [1, 2, 5]
    plain = summarize_level([b], 1.0, speculative=False)
    assert "mean_acceptance_length" not in plain and plain["output_tokens_per_s"] == 5.0
    sp = speedup({"output_tokens_per_s": 6.0, "itl_p50_s": 0.1, "verify_step_p50_s": 0.3},
                 {"output_tokens_per_s": 4.0, "itl_p50_s": 0.2, "tpot_p50_s": 0.2})
    assert sp["output_tokens_per_s"] == 1.5 and sp["itl_p50"] == 2.0 and sp["verify_cost_ratio"] == pytest.approx(1.5)
    assert sp["requests_per_s"] is None
    with pytest.raises(ValueError):
        summarize_level([a], 0.0, speculative=True)


def test_dropped_connections_and_hangs_are_counted_errors_and_return_promptly() -> None:
    modes = ("drop", "reset", "hang", "ok")
    fake = FakeServer(lambda n: modes[n % 4])
    t0 = time.monotonic()
    with fake_server(fake) as url:
        run = run_level(url, prompts(8), 4, RequestParams(max_new_tokens=10), timeout_s=2.0)
    assert time.monotonic() - t0 < 15, "the level must end promptly (per-request timeout 2 s)"
    by_mode: Dict[str, List[RequestRecord]] = {}
    for body in fake.bodies:
        rec = next(r for r in run.records if list(prompts(8)[int(r.id[1:])].prompt_ids) == body["prompt"])
        by_mode.setdefault(modes[fake.bodies.index(body) % 4], []).append(rec)
    assert all(r.ok and r.completion_tokens == 10 for r in by_mode["ok"])
    assert all(not r.ok for m in ("drop", "reset", "hang") for r in by_mode[m])
    assert all("timeout after 2 s" in r.error for r in by_mode["hang"])
    assert all(r.chunk_tokens == (1, 3) for r in by_mode["drop"]), "partial data is kept on a dropped stream"
    s = summarize_level(run.records, run.duration_s, speculative=True)
    assert (s["requests"], s["completed"], s["errors"]) == (8, 2, 6) and len(s["error_messages"]) == 6
    assert s["verify_ct"] == 6 and s["output_tokens"] == 20
    # A server that is not there at all: connection refused, counted, no exception.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    down = run_level(dead, prompts(3), 2, RequestParams(max_new_tokens=4), timeout_s=5)
    assert [r.ok for r in down.records] == [False] * 3 and all("ConnectError" in r.error for r in down.records)


def test_run_benchmark_on_flaky_fake_servers() -> None:
    from sglang_specopd.app.bench.runner import BASE, SPEC, BenchServer, run_benchmark

    spec_fake = FakeServer(lambda n: "drop" if n % 3 == 2 else "ok")  # request 0 is the warm-up
    base_fake = FakeServer(lambda n: "ok", spec=None)
    with fake_server(spec_fake) as spec_url, fake_server(base_fake) as base_url:
        servers = [BenchServer(BASE, base_url), BenchServer(SPEC, spec_url)]
        res = run_benchmark(servers, prompts(4), [1, 2], RequestParams(max_new_tokens=10), timeout_s=10,
                            say=lambda m: None)
        assert [lv["order"] for lv in res["levels"]] == [[SPEC, BASE], [BASE, SPEC]]
        assert spec_fake.flushes == 2 and base_fake.flushes == 2 and len(spec_fake.bodies) == 9
        errors = [lv[SPEC]["errors"] for lv in res["levels"]]
        assert sum(errors) == sum(1 for n in range(1, 9) if n % 3 == 2) == 3
        for lv in res["levels"]:
            s, b = lv[SPEC], lv[BASE]
            assert s["completed"] + s["errors"] == 4 and b["errors"] == 0 and b["completed"] == 4
            assert s["histogram_steps"] == s["verify_ct"] == 3 * s["completed"]
            assert lv["speedup"]["output_tokens_per_s"] == pytest.approx(
                s["output_tokens_per_s"] / b["output_tokens_per_s"])
            assert len(s["per_request"]) == 4 and "mean_acceptance_length" not in b
        assert res["block_size"] == 4 and res["servers"][SPEC]["server_info"]["model_path"] == "/fake/target"
        assert res["acceptance"]["verify_ct"] == 3 * (8 - 3)
        # Wrong kinds of server are refused with a clear error.
        with pytest.raises(BenchError, match="runs no drafter"):
            run_benchmark([BenchServer(SPEC, base_url)], prompts(1), [1], RequestParams(max_new_tokens=4),
                          say=lambda m: None)
        with pytest.raises(BenchError, match="baseline server .* runs speculative decoding"):
            run_benchmark([BenchServer(SPEC, spec_url), BenchServer(BASE, spec_url)], prompts(1), [1],
                          RequestParams(max_new_tokens=4), say=lambda m: None)
    with fake_server(FakeServer(lambda n: "reset")) as url:
        with pytest.raises(BenchError, match="failed the warm-up request 3 times"):
            run_benchmark([BenchServer(SPEC, url)], prompts(1), [1], RequestParams(max_new_tokens=4),
                          say=lambda m: None)


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def _level(c: int, spec_tps: float, base_tps: float, tau: float, step: float, tpot_s: float) -> dict:
    spec = {"output_tokens_per_s": spec_tps, "requests_per_s": spec_tps / 50, "ttft_p50_s": 0.5,
            "itl_p50_s": 0.08, "tpot_p50_s": 0.09, "mean_acceptance_length": tau, "verify_step_p50_s": step,
            "errors": 0}
    base = {"output_tokens_per_s": base_tps, "requests_per_s": base_tps / 50, "ttft_p50_s": 0.4,
            "itl_p50_s": 0.1, "tpot_p50_s": tpot_s, "errors": 1}
    return {"concurrency": c, "specopd": spec, "baseline": base, "speedup": speedup(spec, base)}


def test_report_from_synthetic_results(tmp_path: Path) -> None:
    from PIL import Image

    from sglang_specopd.app.bench.report.build import README_END, README_START, SUMMARY_END, SUMMARY_START, build_report

    results = tmp_path / "results"
    results.mkdir()
    conc = {"command": "specopd bench serve --launch cpu-smollm2", "git_commit": "abc123", "machine":
            {"cpu": "Test CPU", "cores": 2, "gpu": None}, "temperature": 0.0, "max_new_tokens": 64,
            "prompts": [{"id": "a"}] * 8, "servers": {"specopd": {"drafter": "/d/sft", "drafter_choice": "SFT"}},
            "acceptance": {"mean_acceptance_length": 1.2, "verify_ct": 100, "acceptance_histogram": [80, 20],
                           "acceptance_per_domain": {"coding": 1.3, "math": 1.1}},
            "levels": [_level(1, 10.0, 8.0, 2.0, 0.15, 0.1), _level(4, 12.0, 16.0, 1.2, 0.2, 0.1)]}
    (results / "concurrency_test_cpu.json").write_text(json.dumps(conc))
    (results / "sft_smollm2_cpu.json").write_text(json.dumps({"acceptance": {
        "init": {"T0": {"dialogue": 1.01, "coding": 1.02, "math": 1.03, "agentic": 1.04, "mean": 1.025}},
        "sft": {"T0": {"dialogue": 1.1, "coding": 1.2, "math": 1.3, "agentic": 1.4}}}}))
    (results / "tree_scoring_cpu.json").write_text("{not json")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{README_START}\nold table\n{README_END}\nafter\n")
    res = build_report(results, tmp_path / "bench" / "REPORT.md", readme)
    assert SUMMARY_START not in readme.read_text()  # the summary block is optional: no markers, no summary
    md = res.markdown.read_text()
    assert ("| 1 | 10.00 | 8.00 | 1.25x | 0.200 | 0.160 | 0.50 / 0.40 | 80.0 / 100.0 | 90.0 / 100.0 | 2.000 | 1.50 "
            "| 0 / 1 |") in md
    assert "| 4 | 12.00 | 16.00 | 0.75x |" in md and "| 4 | 12.00 | 16.00 | 0.75x | 0.240 | 0.320 |" in md
    assert "Concurrency 1: speculative decoding **wins**, 1.25x" in md and "tau 2.000 above the break-even 1.50" in md
    assert "Concurrency 4: speculative decoding **loses**, 0.75x" in md and "below the break-even 2.00" in md
    assert "It wins at concurrency 1 and loses at 4." in md and "grows from 1.50 at concurrency 1 to 2.00 at 4" in md
    assert "| init | T0 | 1.010 | 1.020 | 1.030 | 1.040 | 1.025 |" in md
    assert "| sft | T0 | 1.100 | 1.200 | 1.300 | 1.400 | 1.250 |" in md
    assert "`serve_smollm2_cpu.json`: not present (skipped)" in md and "`tree_scoring_cpu.json`: unreadable" in md
    assert "Test CPU, 2 cores, no GPU" in md and "`specopd bench serve --launch cpu-smollm2`" in md
    assert sorted(p.name for p in res.plots) == ["acceptance_per_domain.png", "speedup_vs_concurrency.png",
                                                 "throughput_vs_concurrency.png"]
    for p in res.plots:
        assert p.parent == res.markdown.parent and f"]({p.name})" in md
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] > 300
    text = readme.read_text()
    assert res.readme_updated and text.startswith("# Title\n\nbefore\n") and text.endswith(f"{README_END}\nafter\n")
    assert "old table" not in text and "[bench/REPORT.md](bench/REPORT.md)" in text and "| 1 | 10.00 | 8.00 |" in text
    assert not build_report(results, tmp_path / "bench" / "REPORT.md", readme).readme_updated  # idempotent
    assert "## Summary" in md and "- **Serving speed-up** (`concurrency_test_cpu.json`): SpecOPD vs plain serving " \
        "output tokens/s 1.25x / 0.75x at concurrency 1 / 4 (T=0.0); tau 1.200 with drafter `/d/sft`." in md
    readme.write_text(f"# T\n{SUMMARY_START}\nstale 9.99x\n{SUMMARY_END}\nmid\n{README_START}\n{README_END}\n")
    assert build_report(results, tmp_path / "bench" / "REPORT.md", readme).readme_updated
    text = readme.read_text()
    # the README's summary is the headline table (none of its files here) and a pointer; the items are in REPORT.md
    assert "stale" not in text and "\nmid\n" in text and "- **Serving speed-up**" not in text
    assert text.index("Per-arm detail and every other result: [bench/REPORT.md](bench/REPORT.md).") < \
        text.index("\nmid\n") < text.index("| 1 | 10.00 | 8.00 |")
    md = res.markdown.read_text()
    assert "- **SFT** (`sft_smollm2_cpu.json`): ? training sequences (? response tokens), ? steps; mean tau T0 " \
        "1.025 -> 1.250, T1 - -> -." in md and md.count("- **Serving speed-up**") == 1
    readme.write_text(f"{README_START}\n{README_END}\n{SUMMARY_START}\nno end\n")
    with pytest.raises(ValueError, match="needs"):
        build_report(results, tmp_path / "bench" / "REPORT.md", readme)
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="no .* block"):
        build_report(results, tmp_path / "bench" / "REPORT.md", readme)


def test_report_machine_line_without_machine_info(tmp_path: Path) -> None:
    from sglang_specopd.app.bench.report.build import _provenance

    assert _provenance({"command": "c"}).endswith("; machine unknown")
    assert _provenance({"machine": {}}).endswith("; machine unknown")
    assert _provenance({"machine": {"cpu": "X", "cores": 4, "gpu": None}}).endswith("; X, 4 cores, no GPU")
    assert _provenance({"machine": {"cpu": "X", "cores": 4}}).endswith("; X, 4 cores, GPU unknown")
    assert _provenance({"machine": {"cpu": "X", "cores": 4, "gpu": "H200"}}).endswith("; X, 4 cores, H200")
    assert "at commit `0123456789ab + uncommitted changes`" in _provenance({"git_commit": "0123456789abcdef+dirty"})
    assert "at commit `0123456789ab`," in _provenance({"git_commit": "0123456789abcdef"})


def test_report_sweeps_and_gpu_kernels(tmp_path: Path) -> None:
    """Every specopd_sweep*_smollm2_cpu.json gets its own section (saying what the arms trained on), and the GPU
    kernel check gets a parity / speed-up table."""
    import json

    from sglang_specopd.app.bench.report.build import _other_sections, load_results

    arm = {"arm": "sft:lr=1e-3", "acceptance": {"T0": {"mean": 1.39}, "T1": {"mean": 1.16}}, "train_wall_s": 321}
    (tmp_path / "specopd_sweep_smollm2_cpu.json").write_text(json.dumps({"arms": [arm]}))
    (tmp_path / "specopd_sweep_fresh_smollm2_cpu.json").write_text(json.dumps(
        {"arms": [arm], "references": {"offset": 108, "sequences": 211}}))
    (tmp_path / "kernels_gpu.json").write_text(json.dumps({
        "alpha": [{"rows": 8, "vocab": 49152, "dtype": "bfloat16", "max_abs_alpha_diff": 1e-7,
                   "max_abs_grad_diff": 1e-4, "speedup": 7.9}],
        "tree_alpha": [{"target_rows": 4224, "vocab": 151936, "dtype": "float32", "fused_speedup": 2.25,
                        "chunked_speedup": 0.61}],
        "tree_attention": [{"tokens": 9216, "dtype": "torch.bfloat16", "max_abs_diff": 0.0039, "speedup": 9.1}],
        "tree_losses": [{"loss": "e2e_fkl_is", "target_rows": 1971, "vocab": 49152, "rel_value_diff": 1e-7,
                         "max_abs_grad_diff": 3.5e-10, "speedup": 1.97}],
        "draft_sampler": {"draws": 399980, "vocab": 16, "max_abs_freq_minus_q": 0.0013, "q_matches_softmax": True,
                          "greedy_rows_argmax": True, "greedy_rows_one_hot_q": True}}))
    (tmp_path / "specopd_sweep_eval_smollm2_cpu.json").write_text(json.dumps(
        {"arms": [arm], "validation": {"split": "eval", "limit_per_domain": 8}, "references": {"offset": 108},
         "serving": {"draft_sampling": "sample"}}))
    results, _ = load_results(tmp_path)
    md = "\n".join(_other_sections(results))
    assert "Held-out eval prompts: 8 per domain (arms chosen on validation)" in md
    assert md.count("| `sft:lr=1e-3` | 1.390 | 1.160 | 321 |") == 3
    assert "trained on the SFT start's own training responses" in md
    assert md.count("T=1 drafts greedy (argmax), target-only verification") == 2  # files from before the option
    assert md.count("T=1 drafts sampled from q, lossless verification") == 1
    assert "trained on fresh references (train-split prompts from offset 108, 211 responses)" in md
    assert "| fused alpha 8 x 49152 | bfloat16 | 0.0000001 | 0.000100 | 7.90x |" in md
    assert "| tree alpha (fused) 4224 rows x 151936 | float32 | - | - | 2.25x |" in md
    assert "| tree alpha (chunked) 4224 rows x 151936 | float32 | - | - | 0.61x |" in md
    assert "| grouped tree attention 9216 tokens | torch.bfloat16 | 0.00390 | - | 9.10x |" in md
    assert "| tree loss e2e_fkl_is 1971 rows x 49152 vs expanded | float32 | 0.0000001 (rel) | 0.000000000 | 1.97x |" in md
    assert "399980 draws over 16 tokens, max |frequency - q| 0.0013" in md
    assert "one-hot q: True." in md


def test_results_summary_names_each_file_and_reads_its_numbers() -> None:
    from sglang_specopd.app.bench.report.summary import TREE_SCORING_REDO, results_summary

    results = {
        "specopd_smollm2_cpu.json": {
            "acceptance": {"sft_start": {"T0": {"mean": 1.3}, "T1": {"mean": 1.2}},
                           "specopd": {"T0": {"dialogue": 1.1, "coding": 1.2, "math": 1.3, "agentic": 1.4},
                                       "T1": {"mean": 1.25}},
                           "sft_continued": {"T0": {"mean": 1.35}}},
            "supervised_tokens_per_s": {"specopd": 900.4, "sequential_opd": 120}, "budget_target_tokens": 1000,
            "supervised_tokens": {"specopd": 990, "sft_continued": 1000}, "eval": {"limit_per_domain": 8},
            "throughput_ratios": {"end_to_end": 7.33, "target_side": 11.86}},
        "tree_scoring_cpu.json": {"dtype": "float32", "cases": [
            {"anchors": 16, "branches": 4, "prefix_len": 512, "ratio": 7.57, "max_abs_logprob_diff": 2e-5},
            {"anchors": 8, "branches": 4, "prefix_len": 256, "ratio": 1.78, "max_abs_logprob_diff": 1e-5}]},
        "serve_smollm2_cpu.json": {"greedy_identity_dtype": "float32", "bf16_match_rate": 1 / 3, "prompts": [
            {"greedy_identical": True}, {"greedy_identical": True}, {"greedy_identical": False}]},
        "sft_smollm2_big_cpu.json": {"train_sequences": 380, "train_tokens": 50078, "sft": {"steps": 2000},
                                     "acceptance": {"init": {"T0": {"mean": 1.01}, "T1": {"mean": 1.02}},
                                                    "sft": {"T0": {"mean": 1.37}, "T1": {"mean": 1.15}}}},
        "kernels_gpu.json": {"git_commit": "4ef860f6de0d4866ff8c", "device": "NVIDIA H200",
                             "alpha": [{"speedup": 3.65, "max_abs_alpha_diff": 8e-7}, {"speedup": 7.93}],
                             "tree_attention": [{"speedup": 9.64}]},
    }
    text = "\n".join(results_summary(results))
    assert "  | SpecOPD | 1.250 | 1.250 | 990 | 900 |" in text and "  | SFT start | 1.300 | 1.200 | - | - |" in text
    assert "  | continued SFT | 1.350 | - | 1,000 | - |" in text and "equal budgets of 1,000 supervised tokens" in text
    assert "Supervised tokens/s, SpecOPD over sequential-rollout OPD: 7.3x end to end, 11.9x target side." in text
    assert ("16 anchors x 4 branches on 512 tokens 7.6x; 8 anchors x 4 branches on 256 tokens 1.8x; max abs "
            "log-prob difference 2.0e-05 (float32). Note: " + TREE_SCORING_REDO) in text and "#20" in text
    assert "on 2 of 3 prompts in float32; bf16 match rate 0.33" in text
    assert ("- **SFT** (`sft_smollm2_big_cpu.json`): 380 training sequences (50,078 response tokens), 2,000 steps; "
            "mean tau T0 1.010 -> 1.370, T1 1.020 -> 1.150.") in text
    assert "(`kernels_gpu.json`, NVIDIA H200, commit `4ef860f6de0d`," in text
    assert "alpha 3.6-7.9x faster than the torch reference (max alpha difference 8.0e-07)" in text
    assert "grouped tree attention 9.6x vs dense-mask attention" in text and "proposal-tree" not in text
    assert "Serving speed-up" not in text and "sft_smollm2_cpu.json" not in text  # absent files: no item
    gdn = {"dtype": "float32", "target": "tiny-qwen3next", "layer_pattern": "8 layers: 6 GDN + 2 full attention",
           "state_bytes_per_node": 16384,
           "cases": [{"anchors": 16, "branches": 4, "prefix_len": 512, "ratio": 2.70, "max_abs_logprob_diff": 1.3e-5,
                      "roofline_fraction": 0.91, "warm_ratio": 2.7, "prefix_cache": "off"},
                     {"anchors": 8, "branches": 4, "prefix_len": 256, "ratio": 1.9, "max_abs_logprob_diff": 1e-5,
                      "roofline_fraction": 0.875, "warm_ratio": 1.9, "prefix_cache": "off"}]}
    gdn_text = "\n".join(results_summary({"tree_scoring_gdn_cpu.json": gdn}))
    assert ("- **Tree scoring, hybrid GDN target** (`tree_scoring_gdn_cpu.json`, tiny-qwen3next: 8 layers: 6 GDN + 2 "
            "full attention, GDN state 16,384 bytes per node per GDN layer): one `score_trees` forward (indexed state "
            "replay) vs stock SGLang scoring every branch, supervised tokens/s ratio: 16 anchors x 4 branches on 512 "
            "tokens 2.7x; 8 anchors x 4 branches on 256 tokens 1.9x; roofline fraction (cold tree token-forwards/s "
            "over a plain prefill of the same rows) 0.88-0.91; max abs log-prob difference 1.3e-05 (float32).") in gdn_text
    assert TREE_SCORING_REDO not in gdn_text  # the note is for files without a roofline measurement
    ref = {"limit_per_domain": 24, "max_new_tokens": 64, "drafter": "assets/d",
           "temperatures": {"T0": [{"concurrency": 1, "speedup": 0.647, "acceptance": {"mean": 1.6834,
                                                                                  "ci95": [1.62, 1.75]}},
                                   {"concurrency": 2, "speedup": 0.797, "acceptance": {"mean": 1.68}}]}}
    ref_text = "\n".join(results_summary({"concurrency_reference_smollm2_cpu.json": ref}))
    assert ("- **Serving with the reference drafter** (`concurrency_reference_smollm2_cpu.json`, 24 held-out prompts "
            "per domain, 64 new tokens, drafter `assets/d`): speculative vs plain serving output tokens/s, T0: 0.65x / "
            "0.80x at concurrency 1 / 2, tau 1.683 [1.620, 1.750].") in ref_text
    vc = {"dtype": "float32", "threads": 1,
          "rows": [{"m": 1, "forward_over_decode": 1.0}, {"m": 2, "forward_over_decode": 1.55},
                   {"m": 8, "forward_over_decode": 2.11, "linear_over_decode": 2.09, "lm_head_over_decode": 3.14}],
          "served": {"file": "benchmarks/results/c.json", "break_even_tau": 2.67, "tau": 1.727}}
    vc_text = "\n".join(results_summary({"verify_cost_smollm2_cpu.json": vc}))
    assert ("- **Why speculative decoding loses on this CPU** (`verify_cost_smollm2_cpu.json`, SmolLM2 float32, 1 "
            "thread): a verify forward of 8 tokens costs 2.11x a decode forward (linears 2.09x, output head 3.14x; 2 "
            "tokens 1.55x); the served speculative step at concurrency 1 cost 2.67 plain decode steps (`c.json`), so "
            "it breaks even only at tau 2.67 (measured 1.727).") in vc_text
    qsa = dict(gdn, target="tiny-qwen4exp-sparse", layer_pattern="8 layers: 6 GDN + 2 QSA sparse attention",
               qsa_budget=32, qsa_compress_ratio=4,
               cases=[dict(c, groups_per_tree=g, sequential_selections_per_tree=28.0)
                      for c, g in zip(gdn["cases"], (27.5, 28.0))])
    qsa_text = "\n".join(results_summary({"tree_scoring_qsa_cpu.json": qsa}))
    assert ("- **Tree scoring, sparse-linear hybrid (QSA-GDN) target** (`tree_scoring_qsa_cpu.json`, "
            "tiny-qwen4exp-sparse: 8 layers: 6 GDN + 2 QSA sparse attention, QSA budget 32 in blocks of 4): one "
            "`score_trees` forward (GDN state replay, one QSA selection per tree node) vs stock SGLang scoring every "
            "branch (its radix cache off, as QSA targets need on CPU: each branch recomputes its prefix), "
            "supervised tokens/s ratio: 16 anchors x 4 branches on 512 tokens 2.7x; 8 anchors x 4 branches on "
            "256 tokens 1.9x; QSA selections per anchor tree 27.5 (sequential 28.0); 28.0 (sequential 28.0); "
            "roofline fraction") in qsa_text and "hybrid GDN target" not in qsa_text
    new = dict(results["tree_scoring_cpu.json"], cases=[dict(c, roofline_fraction=0.9, warm_ratio=12.25,
                                                             prefix_cache="hit", roofline_fraction_with_head=0.99)
                                                        for c in results["tree_scoring_cpu.json"]["cases"]])
    new_text = "\n".join(results_summary({"tree_scoring_cpu.json": new}))
    assert ("7.6x; 8 anchors x 4 branches on 256 tokens 1.8x; with the reference's K/V from the prefix cache "
            "12.2-12.2x; roofline fraction (cold tree token-forwards/s over a plain prefill of the same rows) "
            "0.90-0.90 (0.99-0.99 counting the LM head over the scored rows, which a plain prefill computes for one "
            "row); max abs log-prob difference 2.0e-05 (float32).") in new_text and "#20" not in new_text
    items = [ln for ln in text.splitlines() if ln.startswith("- **")]
    assert len(items) == 5 and all(re.search(r"\(`[\w.]+\.json`", ln) for ln in items)  # each names its file
    assert results_summary({})[-1] == "No result file yet."


@pytest.mark.parametrize("readme_text", [None, "# no markers\n"])
def test_bench_report_bad_readme_writes_nothing(tmp_path: Path, readme_text: Optional[str]) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    results = tmp_path / "results"
    results.mkdir()
    (results / "sft_smollm2_cpu.json").write_text(json.dumps({"acceptance": {
        "sft": {"T0": {"dialogue": 1.1, "coding": 1.2, "math": 1.3, "agentic": 1.4}}}}))
    readme = tmp_path / "README.md"
    if readme_text is not None:
        readme.write_text(readme_text)
    out = tmp_path / "bench" / "REPORT.md"
    res = CliRunner().invoke(app, ["bench", "report", "--results", str(results), "--out", str(out),
                                   "--readme", str(readme)])
    assert res.exit_code == 2 and res.output.startswith("error: ") and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and str(readme) in res.output
    assert not out.parent.exists()  # no REPORT.md, no PNGs


# ----------------------------------------------------------------------------------------------------------------
# CLI input errors
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["--server", "http://x", "--concurrency", "0,2"], "--concurrency: "),
    (["--server", "http://x", "--concurrency", "1,a"], "comma-separated integers"),
    (["--server", "http://x", "--concurrency", "2,2"], "distinct"),
    (["--server", "http://x", "--launch", "cpu-smollm2"], "exactly one of --server"),
    ([], "exactly one of --server"),
    (["--server", "http://x", "--launch-baseline"], "--launch-baseline needs --launch"),
    (["--server", "http://x", "--drafter", "/d"], "--drafter only applies with --launch"),
    (["--launch", "cpu-smollm2", "--launch-baseline", "--baseline-server", "http://y"], "at most one of"),
    (["--launch", "/nonexistent/config.yaml"], "server config not found"),
])
def test_bench_serve_bad_input_exits_2_with_one_error_line(args, needle) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    res = CliRunner().invoke(app, ["bench", "serve", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_tokenizer_prepared_name_resolves_locally_or_says_prepare(tmp_path: Path, monkeypatch) -> None:
    """--tokenizer smollm2 -> the prepared directory, never the Hub; not prepared -> exit 2 before any request."""
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app
    from sglang_specopd.app.models import KNOWN_MODELS, MARKER_NAME, resolve_tokenizer

    _register_subcommands()
    monkeypatch.setenv("SPECOPD_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for cmd in (["bench", "serve"], ["eval", "acceptance"]):
        t0 = time.monotonic()
        res = CliRunner().invoke(app, [*cmd, "--server", "http://127.0.0.1:9", "--tokenizer", "smollm2"])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert res.output.startswith("error: --tokenizer: ")
        assert "run `specopd models prepare smollm2` first" in res.output
        assert time.monotonic() - t0 < 10
    model = tmp_path / "models" / KNOWN_MODELS["smollm2"].dirname
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / MARKER_NAME).write_text(json.dumps({"dtype": "float32"}))
    assert resolve_tokenizer("smollm2") == str(model)
    assert resolve_tokenizer("/some/dir") == "/some/dir" and resolve_tokenizer(None) is None


def test_bench_serve_unreachable_server_exits_1_and_report_bad_dir(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["bench", "serve", "--server", dead, "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 1 and "error:" in res.output and dead in res.output, res.output
    assert time.monotonic() - t0 < 60 and not (tmp_path / "r.json").exists()
    res = CliRunner().invoke(app, ["bench", "report", "--results", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "is not a directory" in res.output


def test_bench_serve_cli_end_to_end_on_fake_servers(tiny_target: Path, tmp_path: Path, monkeypatch) -> None:
    """The CLI glue: held-out prompts (eval split), both servers, the result file with the shared header."""
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app
    from specopd_trainer.evaluate import eval_records

    _register_subcommands()
    out = tmp_path / "concurrency_fake.json"
    spec_fake, base_fake = FakeServer(lambda n: "ok"), FakeServer(lambda n: "ok", spec=None)
    with fake_server(spec_fake) as spec_url, fake_server(base_fake) as base_url:
        args = ["bench", "serve", "--server", spec_url, "--baseline-server", base_url, "--tokenizer",
                str(tiny_target), "--domains", "math,coding", "--limit", "2", "--concurrency", "2,1",
                "--max-new-tokens", "10", "--out", str(out)]
        monkeypatch.setattr("sys.argv", ["/some/venv/bin/specopd", *args])  # what the console script sees
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    from sglang_specopd.app.results import portable

    assert data["command"] == portable("specopd " + " ".join(args)) and data["git_commit"] and data["machine"]["cores"] >= 1
    assert data["versions"]["sglang"] == "0.5.23" and data["domains"] == ["math", "coding"]
    held = [str(r["id"]) for d in ("math", "coding") for r in eval_records(d, 2)]
    assert [p["id"] for p in data["prompts"]] == held
    assert [lv["concurrency"] for lv in data["levels"]] == [2, 1] and len(spec_fake.bodies) == 1 + 2 * 4
    for lv in data["levels"]:
        assert lv["specopd"]["completed"] == lv["baseline"]["completed"] == 4
        assert lv["specopd"]["mean_acceptance_length"] == pytest.approx(10 / 3)
        assert lv["specopd"]["acceptance_histogram"] == [0, 4, 4, 4, 0]
        assert set(lv["speedup"]) >= {"output_tokens_per_s", "verify_cost_ratio"}
    assert data["servers"]["specopd"]["url"] == spec_url and data["servers"]["baseline"]["launched"] is False


def test_bench_serve_api_generate_streams_sglangs_native_route(tiny_target: Path, tmp_path: Path) -> None:
    """--api generate (what a fleet's router needs): every request on /generate with token ids, same statistics."""
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    out = tmp_path / "generate_fake.json"
    fake = FakeServer(lambda n: "ok")
    with fake_server(fake) as url:
        base = ["bench", "serve", "--server", url, "--tokenizer", str(tiny_target), "--domains", "math", "--limit",
                "2", "--concurrency", "2", "--max-new-tokens", "10", "--out", str(out)]
        res = CliRunner().invoke(app, [*base, "--api", "generate"])
        bad = CliRunner().invoke(app, [*base, "--api", "chat"])
    assert res.exit_code == 0, res.output
    assert bad.exit_code == 2 and "--api must be completions or generate" in bad.output
    data = json.loads(out.read_text())
    assert data["endpoint"] == "/generate (stream, meta_info)"
    assert all("input_ids" in b and "prompt" not in b for b in fake.bodies) and len(fake.bodies) == 1 + 2
    lv = data["levels"][0]["specopd"]
    assert lv["completed"] == 2 and lv["mean_acceptance_length"] == pytest.approx(10 / 3)


# ----------------------------------------------------------------------------------------------------------------
# Live: tiny SPECOPD + plain servers launched by the benchmark itself
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_launched_tiny_servers_record_consistent_spec_stats(tiny_serving_target: Path, tiny_drafter: Path,
                                                            tiny_target: Path, tmp_path: Path, monkeypatch) -> None:
    import yaml
    from transformers import AutoTokenizer

    from conftest import TEST_TAG_ENV, TINY_BLOCK_SIZE, assert_no_orphans, new_process_tag
    from sglang_specopd.app.bench.runner import BASE, SPEC, launched_servers, load_prompts, run_benchmark
    from sglang_specopd.app.results import write_result

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "tiny-bench", "target": str(tiny_serving_target), "drafter": str(tiny_drafter),
        "speculative_algorithm": "SPECOPD", "block_size": TINY_BLOCK_SIZE, "device": "cpu", "dtype": "float32",
        "attention_backend": "torch_native", "max_total_tokens": 4096, "disable_cuda_graph": True,
        "disable_overlap_schedule": True, "sleep_on_idle": True}))
    tag = new_process_tag()
    monkeypatch.setenv(TEST_TAG_ENV, tag)
    texts = ("Return the sum of the arguments.", "def add(a, b):", "What is 17 times 3?", "Call the tool.")
    records = {d: [{"id": f"{d}-{i}", "messages": [{"role": "user", "content": f"{texts[k]} ({i})"}]}
                   for i in range(2)] for k, d in enumerate(("dialogue", "coding", "math", "agentic"))}
    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    bench_prompts, skipped = load_prompts(tok, list(records), 2, records=records)
    assert len(bench_prompts) == 8 and sum(skipped.values()) == 0
    params = RequestParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    with launched_servers(str(cfg), baseline=True, log_dir=tmp_path, say=lambda m: None) as (servers, target):
        assert target == tiny_serving_target and [s.role for s in servers] == [SPEC, BASE]
        ports = [int(s.url.rsplit(":", 1)[1]) for s in servers]
        res = run_benchmark(servers, bench_prompts, [1, 4], params, timeout_s=120, say=lambda m: None)
    for port in ports:
        assert_no_orphans(port=port)
    assert_no_orphans(tag=tag)
    assert res["block_size"] == TINY_BLOCK_SIZE and res["servers"][SPEC]["drafter"] == str(tiny_drafter)
    accepted_any = False
    for lv in res["levels"]:
        s, b = lv[SPEC], lv[BASE]
        assert s["errors"] == b["errors"] == 0 and s["completed"] == b["completed"] == 8
        assert s["output_tokens"] == b["output_tokens"] == 8 * 24
        rows = s["per_request"]
        for r in rows:
            assert sum(r["chunk_tokens"]) == r["completion_tokens"] == 24
            assert sum(r["histogram"]) == r["verify_ct"] > 0, "SGLang's histogram sums to the verify count"
            assert r["accept_length"] == pytest.approx(r["completion_tokens"] / r["verify_ct"])
            accepted_any |= sum(r["histogram"][1:]) > 0
        assert s["histogram_steps"] == s["verify_ct"] == sum(r["verify_ct"] for r in rows)
        assert len(s["acceptance_histogram"]) == TINY_BLOCK_SIZE + 1
        assert s["mean_acceptance_length"] == pytest.approx(
            sum(r["completion_tokens"] for r in rows) / sum(r["verify_ct"] for r in rows))
        assert all(r["verify_ct"] is None for r in b["per_request"])
        assert all(sum(r["chunk_tokens"]) == r["completion_tokens"] == 24 for r in b["per_request"])
        assert lv["speedup"]["output_tokens_per_s"] > 0
    assert accepted_any, "the accepting tiny target makes some verify steps accept drafts"
    path = write_result(tmp_path / "concurrency_tiny.json", res, command="test")
    back = json.loads(path.read_text())
    assert back["levels"][0][SPEC]["per_request"][0]["histogram"] == list(
        res["levels"][0][SPEC]["per_request"][0]["histogram"]) and back["machine"]["cores"] >= 1


def test_results_summary_reads_the_new_result_files() -> None:
    """cpu_attention, reference_corpus and draft_opd_live_traffic each give one headline line with their numbers."""
    from sglang_specopd.app.bench.report.summary import results_summary

    results = {
        "cpu_attention_smollm2_cpu.json": {"speedup_batched_over_loop": {
            "8": {"plain_tokens_per_s": 1.5, "specopd_tokens_per_s": 1.25},
            "1": {"plain_tokens_per_s": 1.0, "specopd_tokens_per_s": 1.04}}},
        "reference_corpus_smollm2_cpu.json": {"response_tokens": 123456, "concurrency": 48, "features_cached": 0,
                                              "per_domain": {"math": {"response_tokens": 123456}},
                                              "this_run": {"generate_tokens_per_s": 210.0}},
        "draft_opd_live_traffic_smollm2_cpu.json": {"live_traffic": {
            "minutes": 15, "tau_before": 1.25, "tau_after": 1.31, "pushes": 7, "serving_errors": 0,
            "requests_served": 420}, "tau_change": {"mean": 0.06, "ci95": [-0.1, 0.2]}},
    }
    text = "\n".join(results_summary(results))
    assert "at concurrency 1 / 8: plain serving 1.00x / 1.50x, SPECOPD 1.04x / 1.25x" in text
    assert "123,456 target response tokens" in text and "math 123,456" in text and "210 response" in text
    assert "420 requests served, 7 hot pushes, 0 serving errors; traffic tau 1.250 before training -> 1.310" in text
    assert "1.310 at the end, change +0.060 [-0.100, +0.200] (different requests" in text


def test_results_summary_reads_the_draft_opd_comparison() -> None:
    """Each finished arm's T0 tau with its interval, the paired difference to continued SFT (flagged when inside
    the noise), T1, and the arms not run yet."""
    from sglang_specopd.app.bench.report.summary import results_summary

    data = {"arms": ["sft_continued", "draft_opd", "specopd"], "budget_target_tokens": 14336,
            "acceptance": {"sft_continued": {"T0": {"mean": 1.7, "ci95": [1.6, 1.8]}, "T1": {"mean": 1.4}},
                           "draft_opd": {"T0": {"mean": 1.65, "ci95": [1.55, 1.75]}, "T1": {"mean": 1.35}},
                           "specopd": {"T0": {"error": "no verify steps"}, "T1": {}}},
            "paired_diff_vs_sft_continued": {"draft_opd": {"T0": {"mean": -0.05, "ci95": [-0.1, 0.01],
                                                                  "inside_noise": True}}},
            "missing_arms": ["sequential_opd"]}
    text = "\n".join(results_summary({"draft_opd_smollm2_cpu.json": data}))
    assert "(`draft_opd_smollm2_cpu.json`)" in text and "budget 14,336 supervised draft tokens" in text
    assert "sft_continued 1.700 [1.600, 1.800], T1 1.400; draft_opd 1.650 [1.550, 1.750] (vs continued SFT " \
           "-0.050 [-0.100, +0.010], inside the noise), T1 1.350. Not run yet: sequential_opd." in text
    assert "specopd" not in text.split("Not run yet")[0]  # an arm whose T0 failed is left out
    assert results_summary({"draft_opd_smollm2_cpu.json": {"arms": []}})[-1] == "No result file yet."


def test_results_summary_reads_the_draft_opd_sweep_files(tmp_path) -> None:
    """A Draft-OPD run on validation prompts is headed as a tuning sweep with its prompts and LR, and its arms
    outside the chosen subset are not listed as "not run yet"; load_results picks the sweep files up by glob."""
    from sglang_specopd.app.bench.report.build import load_results
    from sglang_specopd.app.bench.report.summary import results_summary

    data = {"arms": ["sft_continued", "draft_opd"], "budget_target_tokens": 14336,
            "lr": {"sft_continued": 3e-5, "opd": 3e-5}, "missing_arms": ["specopd"],
            "eval": {"split": "validation", "offset": 100, "limit_per_domain": 8},
            "acceptance": {"sft_continued": {"T0": {"mean": 1.95, "ci95": [1.8, 2.1]}},
                           "draft_opd": {"T0": {"mean": 1.97, "ci95": [1.82, 2.12]}}},
            "paired_diff_vs_sft_continued": {"draft_opd": {"T0": {"mean": 0.02, "ci95": [-0.01, 0.05],
                                                                  "inside_noise": True}}}}
    (tmp_path / "draft_opd_sweep_lr3e-5_smollm2_cpu.json").write_text(json.dumps(data))
    results, _ = load_results(tmp_path)
    text = "\n".join(results_summary(results))
    assert "**Draft-OPD tuning sweep** (`draft_opd_sweep_lr3e-5_smollm2_cpu.json`): served tau on validation " \
           "prompts (train split from 100, not held out, 8 per domain)" in text
    assert "peak LR 3e-05 for every arm: sft_continued 1.950 [1.800, 2.100]; draft_opd 1.970 [1.820, 2.120] " \
           "(vs continued SFT +0.020 [-0.010, +0.050], inside the noise)." in text
    assert "Not run yet" not in text


def test_results_summary_reads_the_cpu_dtype_file() -> None:
    from sglang_specopd.app.bench.report.summary import results_summary

    data = {"rows": [{"threads": 1, "dtype": "float32", "prefill_tokens_per_s": 250.0}],
            "float32_over_bfloat16_prefill": {"2": 12.56, "1": 8.95}, "auto_dtype": "float32",
            "machine": {"cpu": "AMD EPYC", "cpu_simd": "AVX2", "cpu_native_bf16": False}}
    text = "\n".join(results_summary({"cpu_dtype_cpu.json": data}))
    assert ("(`cpu_dtype_cpu.json`): on this AMD EPYC (AVX2, native bf16: False) SmolLM2 prefill is 8.95x / 12.56x "
            "faster in float32 than in bf16 at 1 / 2 threads, so `dtype: auto` serves float32 here.") in text
    assert results_summary({"cpu_dtype_cpu.json": {"rows": []}})[-1] == "No result file yet."


def test_results_summary_reads_the_reference_drafter_and_a_features_only_corpus_run() -> None:
    """The reference drafter's served tau with its intervals; a features-only corpus run reports its feature rate."""
    from sglang_specopd.app.bench.report.summary import results_summary

    results = {
        "reference_drafter_smollm2_cpu.json": {
            "steps": 1100, "train_tokens": 650054, "drafter": {"block_size": 8, "num_layers": 2},
            "plateau": [{"step": 200, "walk_tau": 1.1}, {"step": 1010, "walk_tau": 1.4262}],
            "acceptance": {"T0": {"mean": 1.8123, "ci95": [1.75, 1.87], "prompts": {"math": 24, "coding": 25}},
                           "T1": {"mean": 1.5, "ci95": [1.45, 1.551], "prompts": {"math": 24, "coding": 25}}}},
        "reference_corpus_smollm2_cpu.json": {
            "response_tokens": 667012, "per_domain": {"math": {"response_tokens": 667012}}, "features_cached": 2556,
            "this_run": {"response_tokens": 0, "generate_tokens_per_s": 0.0, "feature_tokens": 1399089,
                         "feature_tokens_per_s": 380.9}},
    }
    text = "\n".join(results_summary(results))
    assert ("block 8, 2 layers, SFT on 650,054 target response tokens (held-out walk tau 1.426 at step 1,010" in text
            and "24+ prompts per domain) T0 1.812 [1.750, 1.870], T1 1.500 [1.450, 1.551]" in text), text
    assert "fetched the context features of 1,399,089 tokens at 381 tokens/s; features cached for 2,556" in text
    assert "generated 0 response" not in text


def test_acceptance_series_leaves_validation_runs_out() -> None:
    """The per-domain acceptance plot shows held-out results only: a run on validation prompts adds no series."""
    from sglang_specopd.app.bench.report.build import acceptance_series

    taus = {"dialogue": 1.5, "coding": 1.6, "math": 1.7, "agentic": 1.8}
    held_out = {"acceptance": {"sft_continued": {"T0": taus}}, "eval": {"split": "eval"}}
    validation = {"acceptance": {"sft_continued": {"T0": taus}}, "eval": {"split": "validation"}}
    series = acceptance_series({"draft_opd_smollm2_cpu.json": held_out,
                                "draft_opd_sweep_lr3e-5_smollm2_cpu.json": validation})
    assert series == {"draft_opd_smollm2_cpu: sft_continued (T=0)": taus}


def test_sse_lines_split_on_newline_only_not_on_unicode_line_separators() -> None:
    import asyncio

    from sglang_specopd.app.bench.client import sse_lines

    # U+2028 and U+0085 inside a JSON string (SGLang writes non-ASCII raw) must not end the line
    event = 'data: {"choices": [{"text": "a\u2028b\x85c"}]}'
    chunks = [event[:10], event[10:] + "\n\n", "data: [DONE]\n", "data: tail"]

    async def feed():
        for c in chunks:
            yield c

    async def collect():
        return [line async for line in sse_lines(feed())]

    got = asyncio.run(collect())
    assert got == [event, "", "data: [DONE]", "data: tail"]
    assert json.loads(got[0][5:])["choices"][0]["text"] == "a\u2028b\x85c"
