"""Real SGLang servers on a tiny fp32 target: SPECOPD is lossless, and its acceptance traces are consistent.

Two servers, one at a time (see conftest): a plain one whose greedy outputs are the reference, then a SPECOPD
one (random block-4 drafter; conftest's ``tiny_specopd_server``: the shared ``tiny_admin_server``, which the
collect / evaluate / swap / score_trees / traffic tests use too). The traffic routes of a server without an admin
key are checked on the parity server (tests/test_trainer_parity.py). The serving target is built so that the
random drafter's guesses are sometimes right (``make_accepting_target``), so verify steps accept 0..3 drafts and
the commit of accepted tokens, and the last-step truncation at ``max_new_tokens``, are really exercised.

What the traces obey (observed, and asserted below):

* one record per verify step: ``len(trace) == spec_verify_ct``;
* the first anchor is the position of the first generated token (``prompt_tokens``): the first token comes from
  the prefill, not from a verify step; each step emits ``accepted + 1`` tokens, so
  ``anchor[i+1] == anchor[i] + accepted[i] + 1``;
* the accepted drafts are exactly the next output tokens, and the first rejected draft differs from the token the
  target emitted there;
* tokens produced = ``1 + sum(accepted + 1)``. The last verify step can overshoot ``max_new_tokens``: SGLang then
  truncates the output (``completion_tokens == max_new_tokens``) but the trace (and SGLang's histogram) keep the
  step's full ``accepted``. So ``completion_tokens == min(1 + sum(accepted + 1), max_new_tokens)``, and the step
  before the last had not reached the limit. ``sum(accepted + 1) == completion_tokens`` does NOT hold: it is off
  by the prefill token, and by the truncated overshoot;
* every record names the drafter version that proposed its block (``"initial"`` on a server that never swapped);
* ``spec_accept_length == completion_tokens / spec_verify_ct`` (so it counts the prefill token and is computed
  after truncation); ``spec_correct_drafts_histogram[k]`` counts the steps with ``accepted == k`` (trailing
  zero bins omitted) and ``spec_num_correct_drafts == sum(accepted)``, both untruncated.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import TINY_BLOCK_SIZE, TINY_NEW_TOKENS, TINY_PROMPTS
from support.serving import TRACE_KEY, check_trace

pytestmark = pytest.mark.server



def _has_no_trace(meta: dict) -> bool:
    return not meta.get(TRACE_KEY)


def test_specopd_greedy_identity_fp32(tiny_plain_outputs, tiny_specopd_server) -> None:
    """SPECOPD greedy output ids == plain greedy output ids, 4 prompts x 32 tokens, float32."""
    accept = {}
    for prompt in TINY_PROMPTS:
        resp = tiny_specopd_server.generate(prompt, TINY_NEW_TOKENS)
        assert resp["output_ids"] == tiny_plain_outputs[prompt], prompt
        assert len(resp["output_ids"]) == TINY_NEW_TOKENS
        accept[prompt] = resp["meta_info"]["spec_accept_length"]
    # Not vacuous: some verify steps accepted drafts, so accepted tokens were committed from the draft path.
    assert max(accept.values()) > 1.5, f"no prompt accepted drafts; the serving target needs retuning: {accept}"


def test_traces_present_and_consistent(tiny_plain_outputs, tiny_specopd_server) -> None:
    records = []
    for prompt in TINY_PROMPTS:
        resp = tiny_specopd_server.generate(prompt, TINY_NEW_TOKENS, trace=True)
        assert resp["output_ids"] == tiny_plain_outputs[prompt], "asking for a trace changed the output"
        records += check_trace(resp, TINY_BLOCK_SIZE, TINY_NEW_TOKENS)
    assert any(r["accepted"] > 0 for r in records) and any(r["accepted"] == 0 for r in records)


def test_trace_absent_when_not_asked(tiny_specopd_server) -> None:
    for trace in (None, False):
        resp = tiny_specopd_server.generate(TINY_PROMPTS[1], 16, trace=trace)
        meta = resp["meta_info"]
        assert _has_no_trace(meta), meta.get(TRACE_KEY)
        assert meta["spec_verify_ct"] >= 1 and len(resp["output_ids"]) == 16


def test_last_step_overshoot_is_truncated(tiny_specopd_server) -> None:
    """A limit that falls inside a verify step's emitted tokens: output truncated, trace keeps the full step."""
    full = tiny_specopd_server.generate(TINY_PROMPTS[0], TINY_NEW_TOKENS, trace=True)
    trace = full["meta_info"][TRACE_KEY]
    step = next((i for i, r in enumerate(trace) if r["accepted"] >= 1), None)
    assert step is not None, "no verify step accepted a draft"
    before = 1 + sum(r["accepted"] + 1 for r in trace[:step])
    limit = before + 1  # the step emits accepted + 1 >= 2 tokens: stop after the first of them
    cut = tiny_specopd_server.generate(TINY_PROMPTS[0], limit, trace=True)
    cut_trace = check_trace(cut, TINY_BLOCK_SIZE, limit)
    assert cut["output_ids"] == full["output_ids"][:limit]
    assert cut_trace == trace[: step + 1], "the truncated request ran the same verify steps, the last one in full"
    assert 1 + sum(r["accepted"] + 1 for r in cut_trace) > limit == cut["meta_info"]["completion_tokens"]


def test_streamed_generate_carries_the_same_trace(tiny_specopd_server) -> None:
    prompt, n = TINY_PROMPTS[1], 24
    whole = tiny_specopd_server.generate(prompt, n, trace=True)
    payload = {"text": prompt, "stream": True, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": n, "ignore_eos": True, "custom_params": {"specopd_trace": True}}}
    chunks = []
    with httpx.stream("POST", tiny_specopd_server.url + "/generate", json=payload, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                chunks.append(json.loads(line[len("data:"):]))
    assert len(chunks) >= 2
    last = chunks[-1]
    assert last["output_ids"] == whole["output_ids"]
    assert last["meta_info"][TRACE_KEY] == whole["meta_info"][TRACE_KEY]
    for c in chunks:  # traces grow step by step, each a prefix of the final one
        t = c["meta_info"].get(TRACE_KEY) or []
        assert t == whole["meta_info"][TRACE_KEY][: len(t)]


def test_chat_completion_returns_trace_in_meta_info(tiny_specopd_server) -> None:
    n = 24
    r = tiny_specopd_server.post("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Hello world"}], "max_tokens": n,
        "temperature": 0, "ignore_eos": True, "custom_params": {"specopd_trace": True}, "return_meta_info": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    meta = choice["meta_info"]
    assert meta["completion_tokens"] == r.json()["usage"]["completion_tokens"] == n
    trace = meta[TRACE_KEY]
    anchors = [t["anchor"] for t in trace]
    assert anchors[0] == meta["prompt_tokens"] and len(trace) == meta["spec_verify_ct"]
    assert all(b == a + t["accepted"] + 1 for a, b, t in zip(anchors, anchors[1:], trace))
    assert min(1 + sum(t["accepted"] + 1 for t in trace), n) == n
    # without custom_params: meta_info (asked for) has no trace
    r2 = tiny_specopd_server.post("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Hello world"}], "max_tokens": 8,
        "temperature": 0, "return_meta_info": True})
    assert r2.status_code == 200 and _has_no_trace(r2.json()["choices"][0]["meta_info"])


def test_concurrent_requests_are_well_formed(tiny_plain_outputs, tiny_specopd_server) -> None:
    """4 concurrent requests (2 traced, 2 not, different lengths): every response is complete and its own."""
    jobs = [(TINY_PROMPTS[0], 32, True), (TINY_PROMPTS[1], 29, False), (TINY_PROMPTS[2], 21, True),
            (TINY_PROMPTS[1], 30, True)]

    def run(job):
        prompt, n, trace = job
        return tiny_specopd_server.generate(prompt, n, trace=trace)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    for (prompt, n, trace), resp in zip(jobs, results):
        assert len(resp["output_ids"]) == resp["meta_info"]["completion_tokens"] == n
        if trace:
            # per-request traces: anchored at this request's prompt, accepted drafts == this request's tokens
            check_trace(resp, TINY_BLOCK_SIZE, n)
        else:
            assert _has_no_trace(resp["meta_info"])
        assert resp["meta_info"]["spec_verify_ct"] >= 1


def test_single_token_request_has_empty_trace(tiny_specopd_server) -> None:
    """max_new_tokens=1: the prefill emits the only token, no verify step runs, the trace is an empty list."""
    resp = tiny_specopd_server.generate(TINY_PROMPTS[0], 1, trace=True)
    assert len(resp["output_ids"]) == 1
    assert resp["meta_info"].get(TRACE_KEY) in ([], None)
    assert not resp["meta_info"].get("spec_verify_ct")


def test_sampled_drafts_are_lossless_and_vary(tiny_plain_outputs, tiny_specopd_server) -> None:
    """temperature 1 with top_p ~0: the target side is one-hot (top-p keeps only its argmax) while the request is
    not greedy, so the worker SAMPLES its drafts from q at T=1 (sglang_specopd.server.sampled_drafts) and verifies them
    with min(1, p/q). Lossless: the output is the greedy output. Sampled: proposals at the same verify step differ
    between repeats (greedy DFLASH drafts would repeat exactly)."""
    prompt = TINY_PROMPTS[0]
    first_steps = set()
    for _ in range(4):
        resp = tiny_specopd_server.generate(prompt, TINY_NEW_TOKENS, trace=True, temperature=1.0, top_p=1e-6)
        assert resp["output_ids"] == tiny_plain_outputs[prompt]
        records = check_trace(resp, TINY_BLOCK_SIZE, TINY_NEW_TOKENS)
        first_steps.add(tuple(records[0]["proposed"]))
    assert len(first_steps) > 1, f"identical proposals over 4 sampled repeats: {first_steps}"
    greedy = [tuple(tiny_specopd_server.generate(prompt, 8, trace=True)["meta_info"][TRACE_KEY][0]["proposed"])
              for _ in range(2)]
    assert greedy[0] == greedy[1], "temperature-0 drafts must stay the argmax"


def test_mixed_greedy_and_sampled_batch_stays_lossless(tiny_plain_outputs, tiny_specopd_server) -> None:
    """Greedy requests batched with sampled-draft requests (T=1, top_p ~0): greedy rows keep argmax drafts and a
    one-hot q, sampled rows draw from q; every output is still the plain greedy output."""
    jobs = [(p, sampled) for p in TINY_PROMPTS for sampled in (False, True)]

    def run(job):
        prompt, sampled = job
        extra = {"temperature": 1.0, "top_p": 1e-6} if sampled else {}
        return tiny_specopd_server.generate(prompt, TINY_NEW_TOKENS, **extra)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    for (prompt, sampled), resp in zip(jobs, results):
        assert resp["output_ids"] == tiny_plain_outputs[prompt], (prompt, sampled)


def test_trace_records_name_the_initial_drafter_version(tiny_specopd_server) -> None:
    """No swap on this server: every verify step was proposed by version "initial", the one the request lists."""
    resp = tiny_specopd_server.generate(TINY_PROMPTS[2], 12, trace=True)
    trace = resp["meta_info"][TRACE_KEY]
    assert trace and {r["drafter_version"] for r in trace} == {"initial"}
    assert resp["meta_info"]["specopd_drafter_versions"] == ["initial"]


@pytest.mark.parametrize("value", ["yes", 1, {}, None, [True]])
def test_non_bool_trace_param_is_a_400_with_a_reason(tiny_specopd_server, value) -> None:
    """custom_params.specopd_trace must be a JSON boolean, on /generate and the OpenAI chat API (was truthiness)."""
    gen = tiny_specopd_server.post("/generate", {"text": "Hello world", "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 2, "custom_params": {"specopd_trace": value}}})
    assert gen.status_code == 400, (value, gen.status_code, gen.text[:300])
    assert "specopd_trace must be true or false" in gen.text, gen.text[:300]
    chat = tiny_specopd_server.post("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Hello world"}], "max_tokens": 2,
        "temperature": 0, "custom_params": {"specopd_trace": value}, "return_meta_info": True})
    assert chat.status_code == 400, (value, chat.status_code, chat.text[:300])
    assert "specopd_trace must be true or false" in chat.text, chat.text[:300]
