"""Acceptance-length evaluation (trainer/specopd_trainer/evaluate.py, ``specopd eval acceptance``).

The live test uses the tiny SPECOPD server shared with ``test_collect.py`` (conftest's ``tiny_specopd_server``); a
plain server and the CLI's output files are checked against stub HTTP servers that answer like SGLang does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Tuple

import pytest

from fakes.http_stub import make_records, stub_server

DOMAINS = ("dialogue", "coding", "math", "agentic")


def by_domain(n_per_domain: int) -> dict:
    recs = make_records(n_per_domain * len(DOMAINS), prefix="e")
    return {d: [r for r in recs if r["domain"] == d] for d in DOMAINS}


def check_sums(result: dict) -> None:
    """Per-domain tau equals the ratio of the raw per-request sums; per-request stats agree with SGLang's."""
    rows = result["per_request"]
    for d, v in result["per_domain"].items():
        mine = [r for r in rows if r["domain"] == d]
        comp, ver = sum(r["completion_tokens"] for r in mine), sum(r["verify_steps"] for r in mine)
        assert (v["requests"], v["completion_tokens"], v["verify_steps"]) == (len(mine), comp, ver)
        assert v["tau"] == pytest.approx(comp / ver) and v["tau"] >= 1.0
        assert v["histogram_steps"] == ver == sum(sum(r["histogram"]) for r in mine)
    for r in rows:
        assert r["accept_length"] == pytest.approx(r["completion_tokens"] / r["verify_steps"])
    taus = [v["tau"] for v in result["per_domain"].values()]
    assert result["mean_tau"] == pytest.approx(sum(taus) / len(taus))


@pytest.mark.server
def test_evaluate_acceptance_on_tiny_server(tiny_specopd_server, tiny_tokenizer) -> None:
    from specopd_trainer.evaluate import evaluate_acceptance

    recs = by_domain(2)
    greedy = evaluate_acceptance(tiny_specopd_server.url, tiny_tokenizer, DOMAINS, 0.0, limit=2, max_new_tokens=24,
                                 concurrency=4, records=recs)
    assert list(greedy["per_domain"]) == list(DOMAINS) and len(greedy["per_request"]) == 8
    assert [r["id"] for r in greedy["per_request"]] == [r["id"] for d in DOMAINS for r in recs[d]]
    check_sums(greedy)
    assert any(sum(r["histogram"][1:]) > 0 for r in greedy["per_request"]), "some drafts are accepted"
    # T=1 with per-request seeds; the tokenizer is the one the server reports (tokenizer=None).
    sampled = evaluate_acceptance(tiny_specopd_server.url, None, ("math", "coding"), 1.0, limit=1, max_new_tokens=16,
                                  concurrency=2, records=recs, progress=False)
    assert [r["domain"] for r in sampled["per_request"]] == ["math", "coding"] and sampled["temperature"] == 1.0
    check_sums(sampled)


def _spec_handler(stats: dict):
    """Stub of a SPECOPD server: replies with the given (completion, verify, histogram) per prompt length."""

    def handler(path: str, body: dict) -> Tuple[int, dict]:
        if path == "/model_info":
            return 200, {"model_path": "unused"}
        comp, ver, hist = stats[len(body["input_ids"]) % len(stats)]
        return 200, {"output_ids": list(range(comp)), "meta_info": {
            "completion_tokens": comp, "spec_verify_ct": ver, "spec_accept_length": comp / ver,
            "spec_correct_drafts_histogram": hist, "finish_reason": {"type": "length"}}}

    return handler


def _plain_handler(path: str, body: dict) -> Tuple[int, dict]:
    return 200, {"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3, "prompt_tokens": 9,
                                                        "finish_reason": {"type": "length"}}}


def test_plain_server_is_a_clear_error(tiny_tokenizer) -> None:
    from specopd_trainer.evaluate import SpecDecodingUnavailableError, evaluate_acceptance

    with stub_server(_plain_handler) as url, pytest.raises(SpecDecodingUnavailableError,
                                                           match="does not run speculative decoding"):
        evaluate_acceptance(url, tiny_tokenizer, DOMAINS, 0.0, limit=2, records=by_domain(2), progress=False)


def test_server_down_is_an_evaluation_error(tiny_tokenizer) -> None:
    from sglang_specopd.app.launch.process import free_port
    from specopd_trainer.evaluate import EvaluationError, evaluate_acceptance

    with pytest.raises(EvaluationError, match="failed after 1 attempts"):
        evaluate_acceptance(f"http://127.0.0.1:{free_port()}", tiny_tokenizer, ["math"], retries=0,
                            records=by_domain(1), progress=False)


def test_summarize_is_a_ratio_of_sums() -> None:
    from specopd_trainer.evaluate import RequestStats, summarize

    def rs(i, d, comp, ver, hist):
        return RequestStats(f"x{i}", d, 10, comp, ver, comp / ver if ver else None, tuple(hist), "length")

    out = summarize([rs(0, "math", 10, 4, [1, 2, 1]), rs(1, "math", 5, 5, [5]), rs(2, "coding", 1, 0, []),
                     rs(3, "coding", 9, 3, [0, 0, 3])], ["math", "coding", "dialogue"])
    assert out["per_domain"]["math"]["tau"] == pytest.approx(15 / 9)
    assert out["per_domain"]["math"]["accepted_drafts_histogram"] == [6, 2, 1]
    assert out["per_domain"]["math"]["mean_request_accept_length"] == pytest.approx((2.5 + 1.0) / 2)
    assert out["per_domain"]["coding"]["tau"] == pytest.approx(10 / 3)  # the prefill-only reply adds 1 token
    assert out["per_domain"]["dialogue"] == {**out["per_domain"]["dialogue"], "tau": None, "requests": 0}
    assert out["mean_tau"] == pytest.approx((15 / 9 + 10 / 3) / 2) and out["pooled_tau"] == pytest.approx(25 / 12)
    assert RequestStats("a", "m", 1, 9, 3, 3.0, (0, 0, 3), None).histogram_accepted == 6


def test_sampling_params() -> None:
    from specopd_trainer.evaluate import sampling_params

    assert sampling_params(0.0, 32, "a") == {"max_new_tokens": 32, "temperature": 0.0}
    assert sampling_params(0.0, 32, "a", spool=False) == {"max_new_tokens": 32, "temperature": 0.0,
                                                          "custom_params": {"specopd_spool": False}}
    t1 = sampling_params(1.0, 32, "a")
    assert (t1["top_p"], t1["top_k"], t1["temperature"]) == (1.0, -1, 1.0)
    assert t1["sampling_seed"] == sampling_params(1.0, 8, "a")["sampling_seed"] != sampling_params(1, 8, "b")[
        "sampling_seed"]


def test_eval_records_are_the_held_out_split(monkeypatch) -> None:
    import specopd_trainer.data as data
    import specopd_trainer.data.splits as splits
    from specopd_trainer.evaluate import eval_records

    recs = make_records(60, prefix="m", domains=("math",))
    monkeypatch.setattr(splits, "load_domain", lambda name, limit=None, seed=0: recs)
    held = data.split(recs, eval_fraction=0.1, seed=0)[1]
    assert 0 < len(held) < 60
    assert eval_records("math") == held and eval_records("math", limit=2) == held[:2]


def test_cli_writes_result_json_and_plot(tiny_target: Path, tiny_tokenizer, tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    import specopd_trainer.evaluate as ev
    from sglang_specopd.app.cli.entry import _register_subcommands, app
    from specopd_trainer.collect import chat_prompt_ids

    _register_subcommands()
    recs = by_domain(3)
    monkeypatch.setattr(ev, "eval_records", lambda d, limit=None: recs[d][:limit])
    stats = {0: (12, 4, [1, 2, 1]), 1: (8, 8, [8])}
    out, png = tmp_path / "res" / "acc.json", tmp_path / "acc.png"
    with stub_server(_spec_handler(stats)) as url:
        r = CliRunner().invoke(app, ["eval", "acceptance", "--server", url, "--domains", "math,coding", "--limit", "2",
                                     "--tokenizer", str(tiny_target), "--out", str(out), "--plot", str(png),
                                     "--label", "init", "--temperature", "1"])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert {"command", "git_commit", "created", "machine", "versions"} <= set(res)
    assert res["label"] == "init" and res["temperature"] == 1.0 and set(res["per_domain"]) == {"math", "coding"}
    for d in ("math", "coding"):
        picked = [stats[len(chat_prompt_ids(tiny_tokenizer, x["messages"])) % 2] for x in recs[d][:2]]
        comp, ver = sum(p[0] for p in picked), sum(p[1] for p in picked)
        v = res["per_domain"][d]
        assert (v["requests"], v["completion_tokens"], v["verify_steps"]) == (2, comp, ver)
        assert v["tau"] == pytest.approx(comp / ver) and res["tau"][d] == v["tau"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with stub_server(_plain_handler) as url:
        r = CliRunner().invoke(app, ["eval", "acceptance", "--server", url, "--domains", "math", "--limit", "1",
                                     "--tokenizer", str(tiny_target)])
    assert r.exit_code == 1 and "does not run speculative decoding" in r.output
