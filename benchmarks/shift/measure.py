"""Measurements of the traffic-shift benchmark: served tau on held-out prompts (with intervals), ITL percentiles."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np


def held_out(domains: Sequence[str], per_domain: int) -> Dict[str, List[dict]]:
    """The first ``per_domain`` held-out prompts of each domain (the same for every arm and every time)."""
    from specopd_trainer.evaluate import eval_records

    return {d: eval_records(d, per_domain) for d in domains}


def served_tau(url: str, tokenizer, records: Dict[str, List[dict]], max_new_tokens: int) -> Dict[str, Any]:
    """Served tau at T=0 on ``records`` (never spooled: ``specopd_spool: false``): ``{"T0": {domain: tau, "mean",
    "ci95", ...}, "per_request": [...]}`` (:func:`specopd_trainer.intervals.acceptance_intervals`)."""
    from specopd_trainer.evaluate import evaluate_acceptance
    from specopd_trainer.intervals import acceptance_intervals

    res = evaluate_acceptance(url, tokenizer, list(records), temperature=0.0, records=records,
                              max_new_tokens=max_new_tokens, progress=False)
    domains = [d for d in records if res["per_domain"][d]["verify_steps"]]
    return {"T0": acceptance_intervals(res["per_request"], domains), "per_request": res["per_request"],
            "wall_s": res["wall_s"]}


def itl_percentiles(records: Sequence[Any], t_from: float, t_to: float) -> Dict[str, Any]:
    """p50 / p99 of the streamed inter-chunk gaps (s) of the load's requests that finished in [t_from, t_to]."""
    gaps = [g for r in records if r.error is None and t_from <= r.done_s <= t_to for g in r.itl_s]
    if not gaps:
        return {"p50": None, "p99": None, "gaps": 0}
    arr = np.asarray(gaps)
    return {"p50": float(np.quantile(arr, 0.5)), "p99": float(np.quantile(arr, 0.99)), "gaps": int(arr.size)}


def load_stats(records: Sequence[Any], t_from: float, t_to: float) -> Dict[str, Any]:
    """Requests, output tokens/s and errors (by kind, 5xx) of the load in [t_from, t_to] (by finish time)."""
    rows = [r for r in records if t_from <= r.done_s <= t_to]
    ok = [r for r in rows if r.error is None]
    errors: Dict[str, int] = {}
    for r in rows:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    span = max(t_to - t_from, 1e-9)
    return {"requests": len(rows), "completion_tokens": sum(r.completion_tokens for r in ok),
            "output_tokens_per_s": sum(r.completion_tokens for r in ok) / span, "errors": errors,
            "errors_5xx": sum(n for k, n in errors.items() if k.isdigit() and k.startswith("5"))}
