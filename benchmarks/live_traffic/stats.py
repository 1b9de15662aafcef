"""Pure statistics of a live-traffic run: tau per time window, before / after spans, errors, trainer summary, result.

Times are seconds on the benchmark clock with 0 = the first traffic request. A request belongs to a window when it
FINISHED inside it (``start <= done_s < end``; SGLang's statistics are known at the end). tau of a set of requests
is SGLang's pooled ratio: sum of ``completion_tokens`` over sum of verify steps of the served requests with at
least one verify step (as ``specopd_trainer.evaluate.summarize``; the prefill token counts, so tau >= 1).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .load import DOMAINS, ServedRequest

NOTE = ("tau_before and tau_after are measured on DIFFERENT requests (the live traffic moves on through the train "
        "prompts), so no paired comparison on the same prompts is possible from the traffic itself: tau_change's "
        "interval is an unpaired bootstrap over requests, and it also contains the change in the prompt mix. The "
        "paired comparison on the same prompts is `heldout_eval` (initial vs final drafter on held-out prompts, "
        "--eval-limit > 0), when it was run.")


def pooled_tau(records: Sequence[ServedRequest]) -> Dict[str, Any]:
    """``{"tau", "requests", "completion_tokens", "verify_steps"}`` of the served ``records`` (errors skipped;
    ``tau`` None without verify steps). ``requests`` counts every served request, with or without verify steps."""
    ok = [r for r in records if r.ok]
    used = [r for r in ok if r.verify_ct > 0]
    comp, ver = sum(r.completion_tokens for r in used), sum(r.verify_ct for r in used)
    return {"tau": comp / ver if ver else None, "requests": len(ok), "completion_tokens": comp, "verify_steps": ver}


def in_span(records: Sequence[ServedRequest], start_s: float, end_s: float) -> List[ServedRequest]:
    """The records that finished in ``[start_s, end_s)``."""
    return [r for r in records if start_s <= r.done_s < end_s]


def errors_by_status(records: Sequence[ServedRequest]) -> Dict[str, int]:
    """``{error key: count}`` (sorted) of the failed ``records``."""
    return dict(sorted(Counter(r.error for r in records if not r.ok).items()))


def window_taus(records: Sequence[ServedRequest], window_s: float, end_s: float) -> List[Dict[str, Any]]:
    """One row per window ``[k w, (k+1) w)`` up to ``end_s`` (the last one cut at ``end_s``): ``t0_s``, ``t1_s``,
    :func:`pooled_tau`'s keys, ``errors`` and ``versions`` ({drafter version: served requests that only it
    proposed for; ``"mixed"`` for requests a push split}). Raises ValueError for ``window_s`` <= 0."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    rows = []
    for k in range(max(1, math.ceil(end_s / window_s - 1e-9))):
        t0, t1 = k * window_s, min((k + 1) * window_s, end_s)
        span = in_span(records, t0, t1)
        versions = Counter((r.versions[0] if len(r.versions) == 1 else "mixed") for r in span if r.ok and r.versions)
        rows.append({"t0_s": round(t0, 3), "t1_s": round(t1, 3), **pooled_tau(span),
                     "errors": sum(1 for r in span if not r.ok), "versions": dict(sorted(versions.items()))})
    return rows


def span_summary(records: Sequence[ServedRequest], start_s: float, end_s: float,
                 domains: Sequence[str] = DOMAINS) -> Dict[str, Any]:
    """Pooled tau of the requests that finished in ``[start_s, end_s)``, per domain too, their latency p50 / p99
    (seconds, send -> reply) and errors."""
    from sglang_specopd.app.bench.metrics import percentile

    span = in_span(records, start_s, end_s)
    lat = [r.done_s - r.sent_s for r in span if r.ok]
    return {"start_s": round(start_s, 3), "end_s": round(end_s, 3), **pooled_tau(span),
            "tau_by_domain": {d: pooled_tau([r for r in span if r.domain == d])["tau"] for d in domains},
            "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
            "errors": errors_by_status(span)}


def tau_by_version(records: Sequence[ServedRequest]) -> Dict[str, Dict[str, Any]]:
    """:func:`pooled_tau` per drafter version, over the served requests proposed for by that version alone."""
    names = sorted({r.versions[0] for r in records if r.ok and len(r.versions) == 1})
    return {v: pooled_tau([r for r in records if r.versions == (v,)]) for v in names}


def tau_difference(after: Sequence[ServedRequest], before: Sequence[ServedRequest], *, n_boot: int = 2000,
                   seed: int = 0, level: float = 0.95) -> Optional[Dict[str, Any]]:
    """Pooled tau of ``after`` minus that of ``before`` with an UNPAIRED percentile bootstrap over requests (each
    side resampled independently; different prompts on the two sides). ``{"mean", "ci95", "inside_noise"}``;
    None when either side has no request with verify steps."""
    import numpy as np

    arr = [np.array([[r.completion_tokens, r.verify_ct] for r in side if r.ok and r.verify_ct > 0], dtype=float)
           for side in (after, before)]
    if any(len(a) == 0 for a in arr):
        return None
    rng = np.random.default_rng(seed)
    boots = []
    for a in arr:
        idx = rng.integers(0, len(a), size=(n_boot, len(a)))
        boots.append(a[idx, 0].sum(1) / a[idx, 1].sum(1))
    diff = boots[0] - boots[1]
    lo, hi = np.quantile(diff, [(1 - level) / 2, 1 - (1 - level) / 2])
    point = arr[0][:, 0].sum() / arr[0][:, 1].sum() - arr[1][:, 0].sum() / arr[1][:, 1].sum()
    return {"mean": float(point), "ci95": [float(lo), float(hi)], "inside_noise": bool(lo <= 0.0 <= hi)}


SUMMED = ("records", "error_records", "blocks", "stale_records", "unknown_version_records", "rollout_tokens")
TRACKED = ("loss", "rollout_tau", "est_tau")


def trainer_summary(run_dir: Path) -> Dict[str, Any]:
    """Steps and a summary of ``run_dir/metrics.jsonl`` (Draft-OPD rows): first / last / mean of loss,
    rollout_tau (the served tau of the traffic a step trained on) and est_tau, sums of the record and block
    counts, the last supervised-token counters, and ``per_step`` = [[step, wall_s, loss, rollout_tau, est_tau]]."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    out: Dict[str, Any] = {"steps": int(rows[-1].get("step", len(rows))) if rows else 0}
    if not rows:
        return out
    for key in TRACKED:
        vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        out[key] = ({"first": vals[0], "last": vals[-1], "mean": sum(vals) / len(vals)} if vals else None)
    for key in SUMMED:
        out[f"total_{key}"] = sum(int(r.get(key) or 0) for r in rows)
    last = rows[-1]
    for key in ("supervised_tokens", "supervised_tokens_per_s", "wall_s"):
        out[key] = last.get(key)
    out["per_step"] = [[r.get("step"), r.get("wall_s")] + [r.get(k) for k in TRACKED] for r in rows]
    return out


def assemble_result(*, records: Sequence[ServedRequest], end_s: float, warmup_s: float, after_s: float,
                    window_s: float, push_times_s: Sequence[float], trainer: Mapping[str, Any],
                    extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The result payload. ``live_traffic`` has the keys of the shared results notes (``minutes``,
    ``tau_before`` = the warm-up span ``[0, warmup_s)``, ``tau_after`` = ``[end_s - after_s, end_s)``,
    ``pushes`` = successful hot pushes up to ``end_s``, ``serving_errors``, ``requests_served``); the rest:
    ``before`` / ``after`` spans, ``tau_change``, ``windows``, ``tau_by_version``, ``errors_by_status``,
    ``push_times_s``, ``trainer`` and ``note``. Requests finishing after ``end_s`` (in flight at the end) count in
    the totals, not in a span. Raises ValueError when the spans do not fit in ``[0, end_s]``."""
    if not (0 < warmup_s <= end_s and 0 < after_s <= end_s):
        raise ValueError(f"spans must fit in the run: warm-up {warmup_s} s, after {after_s} s, run {end_s} s")
    before = span_summary(records, 0.0, warmup_s)
    after = span_summary(records, end_s - after_s, end_s)
    errors = errors_by_status(records)
    pushes = [round(t, 3) for t in push_times_s]
    live = {"minutes": round(end_s / 60, 3), "tau_before": before["tau"], "tau_after": after["tau"],
            "pushes": sum(1 for t in push_times_s if t <= end_s), "serving_errors": sum(errors.values()),
            "requests_served": sum(1 for r in records if r.ok)}
    out: Dict[str, Any] = {
        "live_traffic": live, "before": before, "after": after,
        "tau_change": tau_difference(in_span(records, end_s - after_s, end_s), in_span(records, 0.0, warmup_s)),
        "windows": window_taus(records, window_s, end_s), "window_s": window_s,
        "tau_by_version": tau_by_version(records), "errors_by_status": errors,
        "requests_sent": len(records), "push_times_s": pushes, "trainer": dict(trainer), "note": NOTE,
    }
    if extra:
        out.update(extra)
    return out


def heldout_comparison(initial: Mapping[str, Any], final: Mapping[str, Any],
                       domains: Sequence[str] = DOMAINS) -> Dict[str, Any]:
    """The initial and final drafter on the SAME held-out prompts (``evaluate_acceptance`` results, T=0): each
    one's tau per domain and mean with 95% bootstrap intervals over prompts, and the paired difference final -
    initial (``specopd_trainer.intervals``). A part that cannot be computed (a domain without verify steps)
    becomes ``{"error": reason}``."""
    from specopd_trainer.intervals import acceptance_intervals, paired_difference

    def safe(fn, *a):
        try:
            return fn(*a, domains)
        except ValueError as exc:
            return {"error": str(exc)}

    return {"prompts_per_domain": initial.get("limit"), "temperature": initial.get("temperature"),
            "max_new_tokens": initial.get("max_new_tokens"),
            "initial": safe(acceptance_intervals, initial["per_request"]),
            "final": safe(acceptance_intervals, final["per_request"]),
            "paired_difference": safe(paired_difference, final["per_request"], initial["per_request"])}
