"""The goodput policy against a real SPECOPD server (issue 42): conftest's shared ``tiny_admin_server`` (tiny fp32
target, block-4 drafter, admin key), its policy set at run time through ``POST /specopd/policy``; no server of
its own.

* greedy output is token-identical to the plain server's at every forced k (0..3) and under the measured policy;
* a cost curve that makes k = 0 optimal gives plain decode steps: one target row per request, no drafter forward,
  and no slower than whole-block steps;
* T > 0 is lossless: every sampled token of k-truncated steps (and of whole blocks) is scored under the exact
  target distribution (transformers, fp32): z = sum(log p(y) + H(p)) / sqrt(sum Var[log p]) is ~N(0, 1) for a
  sampler that draws from p, and the same samples scored at a wrong temperature are far out (power check; at
  T = 0.05, since this tiny target's T = 1 distribution is nearly uniform, see below);
* traces keep the drafter's whole proposal, with ``verified`` when fewer were checked; ``meta_info`` carries k.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

import httpx
import pytest

from conftest import TINY_ADMIN_KEY, TINY_BLOCK_SIZE, TINY_NEW_TOKENS, TINY_PROMPTS, RunningServer
from sglang_specopd.wire.policy import POLICY_PATH, VERIFY_K_KEY, PolicySettings, PolicyStats

GAMMA = TINY_BLOCK_SIZE - 1
ADMIN = {"Authorization": f"Bearer {TINY_ADMIN_KEY}"}


def _forcing(k: int) -> dict:
    """A fixed cost curve on which k drafts is optimal whatever the acceptance (1 ms vs 100 ms), no exploration."""
    return {"policy": "goodput", "explore_every": 0,
            "cost_curve_ms": {1: [1.0 if j == k else 100.0 for j in range(GAMMA + 1)]}}


def set_policy(srv: RunningServer, settings: dict) -> PolicyStats:
    r = httpx.post(srv.url + POLICY_PATH, json=settings, headers=ADMIN, timeout=60)
    assert r.status_code == 200, r.text[:300]
    return PolicyStats.model_validate_json(r.content)


def policy_stats(srv: RunningServer) -> PolicyStats:
    r = httpx.get(srv.url + POLICY_PATH, timeout=60)
    assert r.status_code == 200, r.text[:300]
    return PolicyStats.model_validate_json(r.content)


@pytest.fixture(scope="module")
def policy_server(tiny_admin_server: RunningServer):
    """The shared admin server, put back on the fixed policy after this module."""
    yield tiny_admin_server
    set_policy(tiny_admin_server, {"policy": "fixed"})


def _generate_all(srv: RunningServer, prompts, n: int, **sampling) -> List[dict]:
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:  # concurrent: batches of several requests
        return list(pool.map(lambda p: srv.generate(p, n, trace=True, **sampling), prompts))


def test_policy_route_defaults_and_refusals(policy_server) -> None:
    stats = set_policy(policy_server, {"policy": "fixed"})
    assert stats.settings.policy == "fixed" and stats.gamma == GAMMA and stats.unsupported is None
    assert stats.steps == 0 and stats.k_histogram == {k: 0 for k in range(GAMMA + 1)}
    r = httpx.post(policy_server.url + POLICY_PATH, json={"policy": "goodput"}, timeout=60)
    assert r.status_code in (401, 403), r.text[:200]
    for bad in ({"policy": "always"}, {"policy": "goodput", "cost_curve_ms": {1: [1.0, 2.0]}}, {"nope": 1}):
        r = httpx.post(policy_server.url + POLICY_PATH, json=bad, headers=ADMIN, timeout=60)
        assert r.status_code == 400 and r.json(), (bad, r.text[:300])
    resp = policy_server.generate(TINY_PROMPTS[0], 8)
    assert VERIFY_K_KEY not in resp["meta_info"]  # the fixed policy adds nothing to replies
    assert policy_stats(policy_server).k_histogram[GAMMA] > 0


@pytest.mark.parametrize("k", list(range(1, GAMMA + 1)))  # k = 0: test_k0_curve_gives_plain_decode_steps
def test_greedy_identity_at_every_forced_k(policy_server, tiny_plain_outputs, k: int) -> None:
    set_policy(policy_server, _forcing(k))
    outs = _generate_all(policy_server, TINY_PROMPTS, TINY_NEW_TOKENS)
    for prompt, resp in zip(TINY_PROMPTS, outs):
        assert resp["output_ids"] == tiny_plain_outputs[prompt], (k, prompt)
        meta = resp["meta_info"]
        assert set(meta[VERIFY_K_KEY]) == {k}, meta[VERIFY_K_KEY]
        trace = meta["specopd_trace"]
        assert trace and all(len(r["proposed"]) == GAMMA and 0 <= r["accepted"] <= k for r in trace), trace[:3]
        assert all(r.get("verified") == (k if k < GAMMA else None) for r in trace)
        # every accepted proposal is what was emitted after its anchor
        seq = [None] * int(meta["prompt_tokens"]) + resp["output_ids"]
        for rec in trace:
            got = seq[rec["anchor"] + 1: rec["anchor"] + 1 + rec["accepted"]]
            assert got == rec["proposed"][: len(got)], rec
    stats = policy_stats(policy_server)
    assert stats.reasons == {"given": stats.steps} and stats.k_histogram[k] == stats.steps > 0
    assert stats.breakdown.verify_rows == pytest.approx(k + 1)


def test_k0_curve_gives_plain_decode_steps(policy_server, tiny_plain_outputs) -> None:
    """k = 0 optimal: no drafter forward, one target row per request, and steps no slower than whole blocks."""
    def mean_step(settings) -> PolicyStats:
        set_policy(policy_server, settings)
        outs = _generate_all(policy_server, TINY_PROMPTS, TINY_NEW_TOKENS)
        assert [o["output_ids"] for o in outs] == [tiny_plain_outputs[p] for p in TINY_PROMPTS]
        k0 = settings.get("cost_curve_ms") is not None
        for o in outs:
            assert not k0 or (set(o["meta_info"][VERIFY_K_KEY]) == {0} and o["meta_info"]["specopd_trace"] == [])
        return policy_stats(policy_server)

    plain = mean_step(_forcing(0))  # identical to plain serving, nothing proposed, k = 0 at every step
    assert plain.k_histogram[0] == plain.steps > 0 and plain.breakdown.verify_rows == 1.0
    assert plain.breakdown.drafter_forward == 0.0
    block = mean_step({"policy": "fixed"})
    assert block.breakdown.verify_rows == TINY_BLOCK_SIZE and block.breakdown.drafter_forward > 0
    # per emitted token a plain step costs less than a block step here only if acceptance is low; per STEP it
    # must cost less: it runs neither the drafter nor the extra verify rows
    assert plain.breakdown.step < block.breakdown.step, (plain.breakdown, block.breakdown)


def test_alternating_k0_and_drafting_steps(policy_server, tiny_plain_outputs) -> None:
    """k = 0 optimal with exploration after every k = 0 step: plain-decode steps and k = 1 steps alternate (issue
    53). Output == plain serving; the k = 0 steps are SGLang's plain decode, and the drafter's context they skipped is
    caught up before the next k = 1 step: at every anchor both runs drafted from, its proposals are the ones of a run
    whose k = 0 steps went through the verify path (drafter context written at every step)."""
    alternate = {"policy": "goodput", "explore_every": 1, "cost_curve_ms": {1: [1.0] + [100.0] * GAMMA}}
    traces = {}
    runs = {True: {}, False: {"plain_k0": False}, "capped": {"explore_every": 5, "catch_up_every": 2}}
    for plain_k0, extra in runs.items():  # capped: runs of 5 plain steps, caught up in the plain step every 2
        set_policy(policy_server, {**alternate, **extra})
        outs = _generate_all(policy_server, TINY_PROMPTS, TINY_NEW_TOKENS)
        assert [o["output_ids"] for o in outs] == [tiny_plain_outputs[p] for p in TINY_PROMPTS], plain_k0
        stats = policy_stats(policy_server)
        hist = stats.k_histogram
        assert hist[0] > 0 and hist[1] > 0 and hist[0] + hist[1] == stats.steps, hist
        assert stats.reasons.get("explore", 0) == hist[1], stats.reasons
        if plain_k0:
            assert stats.plain_steps == hist[0] and stats.context_catch_up > 0, stats
        else:
            assert stats.plain_steps == 0 and stats.context_catch_up == 0, stats
        traces[plain_k0] = [{r["anchor"]: r for r in o["meta_info"]["specopd_trace"]} for o in outs]
    for run in (True, "capped"):
        common = 0
        for caught, written in zip(traces[run], traces[False]):
            for anchor in set(caught) & set(written):
                common += 1
                assert caught[anchor]["proposed"] == written[anchor]["proposed"], (run, caught[anchor], written[anchor])
        assert common > 0, run


def test_measured_policy_calibrates_and_stays_lossless(policy_server, tiny_plain_outputs) -> None:
    set_policy(policy_server, {"policy": "goodput", "calibration_steps": 1, "refresh_every": 8})
    outs = _generate_all(policy_server, TINY_PROMPTS, TINY_NEW_TOKENS)
    assert [o["output_ids"] for o in outs] == [tiny_plain_outputs[p] for p in TINY_PROMPTS]
    stats = policy_stats(policy_server)
    assert stats.reasons.get("calibrate", 0) >= GAMMA + 1  # every k measured at least once in some bucket
    assert any(all(v is not None for v in row) for row in stats.cost_curve_ms.values()), stats.cost_curve_ms
    assert sum(stats.k_histogram.values()) == stats.steps
    assert stats.breakdown.step > 0 and stats.breakdown.target_forward > 0


# --- T > 0: every sampled token scored under the exact target distribution ------------------------------
# The tiny target's logits are nearly flat (std ~0.16: entropy 6.92 of log(1024) = 6.93 nats at T = 1), so at T = 1
# no sampler can be told from another on it; T = 0.05 (logit std ~3) runs the same code (sampled drafts, rejection
# sampling, residual / bonus draws) on sharp distributions where a 10% temperature error is ~6 sigma (checked below
# at 30%: the power control). T = 1 is still checked for the null (a wrong sampler there would also fail it).

SAMPLE_PROMPTS = ("def add(a, b):", "Hello world", "import os\n", "Return the sum of the arguments.")
SAMPLE_REPEATS = 12
SAMPLE_TOKENS = 16


@pytest.fixture(scope="module")
def hf_target(tiny_serving_target):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_serving_target)
    model = AutoModelForCausalLM.from_pretrained(tiny_serving_target, dtype=torch.float32).eval()
    return tok, model


def _sample_ids(srv: RunningServer, prompt_ids: List[List[int]], temperature: float) -> List[List[int]]:
    params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "max_new_tokens": SAMPLE_TOKENS,
              "ignore_eos": True}

    def one(ids):
        r = srv.post("/generate", {"input_ids": ids, "sampling_params": params})
        assert r.status_code == 200, r.text[:300]
        return r.json()["output_ids"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, prompt_ids))


def _logits(model, prompt_ids: List[List[int]], outs: List[List[int]]):
    """Per sequence, the target's fp32 logits [len(out), V] at the positions that sampled ``out`` (one batched
    forward per distinct prompt: its samples have equal lengths)."""
    import torch

    rows = {}
    with torch.no_grad():
        for ids in {tuple(p) for p in prompt_ids}:
            which = [i for i, p in enumerate(prompt_ids) if tuple(p) == ids]
            seqs = torch.tensor([list(ids) + outs[i] for i in which])
            logits = model(seqs).logits[:, len(ids) - 1: seqs.shape[1] - 1].float()
            rows.update({i: logits[j] for j, i in enumerate(which)})
    return [rows[i] for i in range(len(prompt_ids))]


def _z(logits, outs: List[List[int]], temperature: float) -> Dict[str, float]:
    """z = sum(log p(y) + H(p)) / sqrt(sum Var_p[log p]) over every sampled token, p = softmax(logits / T):
    ~N(0, 1) when the tokens were drawn from p (CLT over the tokens)."""
    import torch

    s = v = 0.0
    n = 0
    for lg, out in zip(logits, outs):
        lp = torch.log_softmax(lg / temperature, -1)
        p = lp.exp()
        ent = -(p * lp).sum(-1)
        var = (p * lp * lp).sum(-1) - ent * ent
        chosen = lp.gather(-1, torch.tensor(out).unsqueeze(-1)).squeeze(-1)
        s += float((chosen + ent).sum())
        v += float(var.clamp_min(0).sum())
        n += len(out)
    return {"z": s / math.sqrt(max(v, 1e-12)), "tokens": n, "mean_log_p_gap": s / max(n, 1)}


MEASURED = {"policy": "goodput", "calibration_steps": 1, "refresh_every": 8}


@pytest.mark.parametrize("temperature,settings", [
    (0.05, {"policy": "fixed"}), (0.05, _forcing(1)), (0.05, _forcing(0)), (0.05, MEASURED), (1.0, MEASURED)],
    ids=["T0.05-whole-block", "T0.05-k1", "T0.05-k0", "T0.05-measured", "T1-measured"])
def test_sampled_tokens_follow_the_target_distribution(policy_server, hf_target, temperature, settings) -> None:
    tok, model = hf_target
    set_policy(policy_server, settings)
    prompt_ids = [tok(p)["input_ids"] for p in SAMPLE_PROMPTS for _ in range(SAMPLE_REPEATS)]
    outs = _sample_ids(policy_server, prompt_ids, temperature)
    assert all(len(o) == SAMPLE_TOKENS for o in outs)
    logits = _logits(model, prompt_ids, outs)
    fit = _z(logits, outs, temperature)
    assert abs(fit["z"]) < 4.0, fit  # ~N(0, 1): |z| >= 4 once in ~16,000 runs
    if temperature < 1.0:  # power: the same tokens scored 30% off the served temperature are far out
        hot, cold = _z(logits, outs, temperature * 1.3), _z(logits, outs, temperature * 0.75)
        assert hot["z"] > 6.0 and cold["z"] < -6.0, (fit, hot, cold)
    stats = policy_stats(policy_server)
    if settings["policy"] == "fixed" or "cost_curve_ms" in settings:
        want = GAMMA if settings["policy"] == "fixed" else settings["cost_curve_ms"][1].index(1.0)
        assert stats.k_histogram[want] == stats.steps > 0
    else:
        assert sum(stats.k_histogram.values()) == stats.steps > 0


def test_settings_model_round_trip() -> None:
    s = PolicySettings.model_validate(_forcing(2))
    assert s.cost_curve_ms == {1: [100.0, 100.0, 1.0, 100.0]}



def _scrape(srv: RunningServer) -> Dict[tuple, float]:
    """``GET /metrics`` (SGLang's own route, ``--enable-metrics``) as ``{(name, sorted labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(srv.url + "/metrics", timeout=60)
    assert r.status_code == 200, r.text[:300]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def _total(samples: Dict[tuple, float], name: str, **labels) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    want = {k: str(v) for k, v in labels.items()}
    return sum(v for (n, lab), v in samples.items() if n == name and want.items() <= dict(lab).items())


def test_metrics_move_after_traffic_and_a_swap(policy_server, tiny_drafter) -> None:
    # The shared server runs with SGLang's --enable-metrics (conftest): SGLang's series and the plugin's
    # (docs/metrics.md) on the same /metrics, and SPECOPD serves as before.
    import json

    from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH, SCORE_TREES_PATH, SWAP_DRAFTER_PATH

    before = _scrape(policy_server)
    assert any(n.startswith("sglang:") for n, _ in before), "SGLang's own series are missing"
    set_policy(policy_server, _forcing(1))
    try:
        outs = _generate_all(policy_server, TINY_PROMPTS, 8)
    finally:
        set_policy(policy_server, {"policy": "fixed"})
    assert all(len(o["output_ids"]) == 8 for o in outs)
    r = httpx.post(policy_server.url + SWAP_DRAFTER_PATH, headers=ADMIN, timeout=300,
                   content=json.dumps({"path": str(tiny_drafter), "version": "metrics-v2"}).encode())
    assert r.status_code == 200, r.text[:300]
    _generate_all(policy_server, TINY_PROMPTS[:2], 8)  # whole blocks under the fixed policy, the new version
    big = httpx.post(policy_server.url + SCORE_TREES_PATH, content=b"{" + b" " * 1_100_000 + b"}",
                     headers={"content-type": "application/json"}, timeout=60)
    assert big.status_code == 413
    after = _scrape(policy_server)

    def moved(name, **labels):
        return _total(after, name, **labels) - _total(before, name, **labels)

    assert moved("specopd:spec_policy_k_total", k=1) > 0  # decode steps (batches) of the forced policy: k = 1
    assert moved("specopd:spec_policy_k_total", k=0) == 0
    drafts = moved("specopd:spec_decode_num_drafts_total")
    assert drafts > 0
    assert moved("specopd:spec_decode_num_draft_tokens_total") >= drafts  # k = 1 rows, then whole blocks (3)
    accepted = moved("specopd:spec_decode_num_accepted_tokens_total")
    assert accepted == sum(moved("specopd:spec_decode_num_accepted_tokens_per_pos_total", position=p)
                           for p in range(1, GAMMA + 1)) and accepted > 0  # this drafter is accepted
    version = httpx.get(policy_server.url + DRAFTER_INFO_PATH, timeout=60).json()["version"]
    assert version == "metrics-v2"
    assert _total(after, "specopd:drafter_info", version="metrics-v2") == 1
    assert sum(v for (n, lab), v in after.items() if n == "specopd:drafter_info") == 1  # only the serving one
    assert moved("specopd:drafter_ops_total", op="swap", outcome="ok") == 1
    assert _total(after, "specopd:traffic_spool_bytes") > 0  # this server records live traffic
    assert moved("specopd:score_trees_requests_total") == 1
    assert moved("specopd:score_trees_refusals_total", code=413) == 1
    assert all(dict(lab).get("model_name") for (n, lab), _ in after.items() if n.startswith("specopd:"))


def test_the_main_jobs_speed_arms_run_plain_steps_then_swap_and_swap_back(policy_server: RunningServer) -> None:
    """measure_speed on the real server: the plain arm runs only k = 0 steps, the drafter arms speculate, the
    start drafter is swapped in before its arm and the adapted one back after it, every prompt is paired."""
    from sglang_specopd.app.bench.client import BenchPrompt
    from sglang_specopd.app.main_job.speed import measure_speed

    calls: List[str] = []
    prompts = [BenchPrompt(f"p{i}", ("japanese", "wordsort")[i % 2], tuple(range(5 + i, 12 + i))) for i in range(4)]
    got = measure_speed(policy_server.url, TINY_ADMIN_KEY, prompts, max_new_tokens=8, warmup=1,
                        swap_start=lambda: calls.append("start"), swap_adapted=lambda: calls.append("adapted"),
                        domains=["japanese", "wordsort"], say=lambda m: calls.append("say"))
    assert [c for c in calls if c != "say"] == ["start", "adapted"]
    hist = got["policy_k_histogram"]
    assert {int(k) for k, n in hist["plain"].items() if n} == {0}
    assert any(int(k) > 0 and n for k, n in hist["adapted"].items())
    assert got["prompts"] == 4 and all(len(got["records"][a]) == 4 for a in ("plain", "start", "adapted"))
    assert all(r["completion_tokens"] == 8 for r in got["records"]["plain"])
    assert got["plain"] > 0 and got["ratios"]["adapted_over_plain"]["prompts"] == 4
    assert set(got["by_domain"]) == {"japanese", "wordsort"}
