"""The main job's closing measurement (issue 53): what adapting the drafter buys in tokens/s.

On the NEW domains' held-out prompts (``speed_prompts`` per domain, greedy, ``eval_max_new_tokens`` tokens each with
``ignore_eos``, one request in flight, never spooled as traffic), in the SAME server process, three arms, each
after its policy is set (``POST /specopd/policy``, admin key) and an unmeasured warm-up over ``warmup`` prompts:

- ``plain``: the goodput policy forced to k = 0 with ``plain_k0`` (every step is SGLang's plain decode,
  docs/goodput.md; a k = 0 step costs a plain step: ``benchmarks/goodput/k0_step.py``);
- ``start``: the shipped drafter, hot-swapped back in, under the goodput policy;
- ``adapted``: the drafter the adapter deployed, under the goodput policy (the same as ``start`` when nothing was
  deployed: then not measured twice).

Order: adapted, plain, start; then the adapted drafter is swapped back, so the server ends serving what it served.
Throughput of an arm = its tokens / its summed request latency over the prompts every arm completed; ratios with
paired bootstrap 95% intervals over prompts (:func:`sglang_specopd.app.bench.metrics.ratio_ci`), overall and per
domain. Units: tokens/s of one request at a time (concurrency 1), T = 0.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import httpx

ARMS = ("plain", "start", "adapted")
GOODPUT = {"policy": "goodput"}


def forced_plain(gamma: int, plain_k0: bool = True) -> Dict[str, Any]:
    """Policy settings on which k = 0 is optimal at every step: a fixed cost curve, no exploration; ``plain_k0``
    (default on) runs those steps as SGLang's plain decode, off through the verify path. ``gamma``: drafts per block
    (block_size - 1). Also benchmarks/goodput/k0_step.py's forced arms."""
    return {"policy": "goodput", "explore_every": 0, "plain_k0": plain_k0,
            "cost_curve_ms": {1: [1.0] + [100.0] * gamma}}


def _rows(records) -> List[Dict[str, Any]]:
    return [{"id": r.id, "domain": r.domain, "ok": r.ok, "completion_tokens": r.completion_tokens,
             "latency_s": r.latency_s, "verify_ct": r.verify_ct} for r in records]


def speed_summary(rows: Mapping[str, Sequence[Mapping[str, Any]]], domains: Sequence[str]) -> Dict[str, Any]:
    """``{plain, start, adapted}`` tokens/s (each a mean over the prompts every arm completed, as sum(tokens) /
    sum(latency)), ``ratios`` (``adapted_over_plain``, ``start_over_plain``, ``adapted_over_start``: ``{mean, ci95,
    prompts}``) and ``by_domain`` (the same per domain). ``rows``: arm -> records with ``id``, ``domain``, ``ok``,
    ``completion_tokens``, ``latency_s``; an arm missing from ``rows`` (``adapted`` when nothing was deployed) is
    the ``start`` arm. Raises ValueError when no prompt completed on every arm."""
    from sglang_specopd.app.bench.metrics import ratio_ci

    rows = {a: list(rows.get(a) or rows["start"]) for a in ARMS}
    common = set.intersection(*({r["id"] for r in rows[a] if r["ok"]} for a in ARMS))
    if not common:
        raise ValueError("no prompt completed on every arm")

    def tps(recs: Sequence[Mapping[str, Any]]) -> float:
        kept = [r for r in recs if r["id"] in common]
        return sum(r["completion_tokens"] for r in kept) / sum(r["latency_s"] for r in kept)

    def ratios(keep: Callable[[Mapping[str, Any]], bool]) -> Dict[str, Any]:
        sub = {a: [r for r in rows[a] if r["id"] in common and keep(r)] for a in ARMS}
        return {"adapted_over_plain": ratio_ci(sub["adapted"], sub["plain"]),
                "start_over_plain": ratio_ci(sub["start"], sub["plain"]),
                "adapted_over_start": ratio_ci(sub["adapted"], sub["start"])}

    out: Dict[str, Any] = {a: round(tps(rows[a]), 2) for a in ARMS}
    out["ratios"] = ratios(lambda r: True)
    out["by_domain"] = {}
    for d in domains:
        if any(r["domain"] == d and r["id"] in common for r in rows["plain"]):
            sub = {a: [r for r in rows[a] if r["domain"] == d] for a in ARMS}
            out["by_domain"][d] = {**{a: round(tps(sub[a]), 2) for a in ARMS},
                                   **ratios(lambda r, d=d: r["domain"] == d)}
    out["prompts"] = len(common)
    return out


def measure_speed(url: str, admin_key: str, prompts: Sequence[Any], *, max_new_tokens: int, warmup: int,
                  swap_start: Callable[[], Any], swap_adapted: Optional[Callable[[], Any]],
                  domains: Sequence[str], say=print) -> Dict[str, Any]:
    """Run the three arms (module docstring) on ``prompts`` (:class:`~sglang_specopd.app.bench.client.BenchPrompt`)
    and return :func:`speed_summary` plus ``records`` (arm -> per-prompt rows) and ``policy`` (arm -> its chosen-k
    histogram). ``swap_start`` / ``swap_adapted`` hot-swap that drafter in (``swap_adapted`` None: nothing was
    deployed, the start drafter serves). Raises httpx.HTTPStatusError when the server refuses a policy."""
    from sglang_specopd.app.bench.client import RequestParams, run_level
    from sglang_specopd.wire.policy import POLICY_PATH

    headers = {"Authorization": f"Bearer {admin_key}"}
    gamma = httpx.get(url + POLICY_PATH, timeout=60).raise_for_status().json()["gamma"]
    params = RequestParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, spool=False)
    rows: Dict[str, List[Dict[str, Any]]] = {}
    policy: Dict[str, Any] = {}
    order = [("adapted", GOODPUT), ("plain", forced_plain(gamma)), ("start", GOODPUT)]
    if swap_adapted is None:
        order = order[1:]
    swapped = False
    try:
        for arm, settings in order:
            if arm == "start" and swap_adapted is not None:
                swapped = True
                swap_start()
            httpx.post(url + POLICY_PATH, json=settings, headers=headers, timeout=60).raise_for_status()
            run_level(url, list(prompts[:warmup]), 1, params)
            run = run_level(url, list(prompts), 1, params)
            rows[arm] = _rows(run.records)
            policy[arm] = httpx.get(url + POLICY_PATH, timeout=60).raise_for_status().json()["k_histogram"]
            ok = [r for r in rows[arm] if r["ok"]]
            tps = sum(r["completion_tokens"] for r in ok) / max(sum(r["latency_s"] for r in ok), 1e-9)
            say(f"speed, {arm}: {tps:.1f} tokens/s over {len(ok)} held-out prompts (one at a time)")
    finally:
        if swapped:
            swap_adapted()
    return {**speed_summary(rows, domains), "records": rows, "policy_k_histogram": policy,
            "max_new_tokens": max_new_tokens, "concurrency": 1, "temperature": 0.0}
