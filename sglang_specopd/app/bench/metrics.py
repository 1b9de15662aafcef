"""Per-level summaries from raw :class:`~sglang_specopd.app.bench.client.RequestRecord` s (pure functions).

Definitions follow SGLang's ``sglang.benchmark.serving`` (``bench_serving``) so SGLang users read the same numbers:

- ``output_tokens_per_s`` = completion tokens of the successful requests / level duration (first send -> last
  end); ``requests_per_s`` = successful requests / level duration.
- TTFT = send -> first chunk that carries a token (seconds).
- ITL: for every chunk after the first, its gap to the previous chunk divided by the tokens it carries, counted
  once per token (a speculative chunk of n tokens after a gap g gives n values g/n), as bench_serving does for
  SGLang's native streaming and for speculative decoding over the OpenAI API (there from re-tokenized text; here
  the token counts are exact, from ``continuous_usage_stats``).
- TPOT = (latency - TTFT) / (completion tokens - 1) per request with >= 2 tokens. ITL is what the client sees:
  on a loaded machine chunks can arrive in bursts (ITL p50 far below TPOT), so TPOT is the steadier per-token
  cost of a request.
- Percentiles: numpy's linear interpolation (as bench_serving); None when there are no values.
- Acceptance length (tau) = sum of completion tokens / sum of verify steps over the successful requests that
  report verify steps (a ratio of sums, as ``specopd eval acceptance`` and SGLang's server-wide metric). The
  histogram sums SGLang's per-request ``spec_correct_drafts_histogram`` (bin k = verify steps that accepted k
  drafts, i.e. emitted k + 1 tokens), padded to buckets 0..block_size; its total is the verify count.
- ``verify_step_s``: per request (latency - TTFT) / verify steps, the time of one draft + verify step as the
  client sees it; the baseline's counterpart is TPOT (one plain decode step per token).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from sglang_specopd.app.bench.client import RequestRecord

PERCENTILES = (50, 90, 99)
MAX_ERROR_MESSAGES = 10


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def itl_values(rec: RequestRecord) -> List[float]:
    """Inter-token latencies (seconds) of one request: each later chunk's gap / its tokens, once per token."""
    out: List[float] = []
    for k in range(1, len(rec.chunk_times_s)):
        n = rec.chunk_tokens[k]
        out.extend([(rec.chunk_times_s[k] - rec.chunk_times_s[k - 1]) / n] * n)
    return out


def tpot(rec: RequestRecord) -> Optional[float]:
    """(latency - TTFT) / (completion tokens - 1) in seconds per token; None below 2 tokens or without TTFT."""
    if rec.ttft_s is None or rec.completion_tokens < 2:
        return None
    return (rec.latency_s - rec.ttft_s) / (rec.completion_tokens - 1)


def verify_step_s(rec: RequestRecord) -> Optional[float]:
    """(latency - TTFT) / verify steps in seconds; None without verify steps or TTFT."""
    if rec.ttft_s is None or not rec.verify_ct:
        return None
    return (rec.latency_s - rec.ttft_s) / rec.verify_ct


def padded_histogram(hists: Iterable[Sequence[int]], block_size: Optional[int] = None) -> List[int]:
    """Bucket-wise sum of histograms, padded to at least ``block_size + 1`` buckets (0..block_size) when given.

    A histogram longer than that (not possible with SGLang's DFlash workers) keeps its extra buckets.
    """
    hists = [list(h) for h in hists]
    width = max([len(h) for h in hists] + [0 if block_size is None else block_size + 1])
    return [sum(h[k] for h in hists if k < len(h)) for k in range(width)]


def _stats(prefix: str, values: Sequence[float]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {f"{prefix}_mean_s": sum(values) / len(values) if values else None}
    out.update({f"{prefix}_p{q}_s": percentile(values, q) for q in PERCENTILES})
    return out


def acceptance(records: Sequence[RequestRecord], block_size: Optional[int] = None) -> Dict[str, Any]:
    """tau, verify count and histogram over the successful records that report verify steps, overall and per domain.

    A successful record without verify steps counts as 0 verify steps only if it has <= 1 token (it ended with
    its prefill token); otherwise it is counted in ``spec_stats_missing`` and left out.
    """
    known, missing = [], 0
    for r in records:
        if not r.ok:
            continue
        if r.verify_ct is not None or r.completion_tokens <= 1:
            known.append(r)
        else:
            missing += 1

    def tau(rows: Sequence[RequestRecord]) -> Optional[float]:
        ver = sum(r.verify_ct or 0 for r in rows)
        return sum(r.completion_tokens for r in rows) / ver if ver else None

    hist = padded_histogram((r.histogram for r in known), block_size)
    domains = sorted({r.domain for r in known})
    return {"mean_acceptance_length": tau(known), "verify_ct": sum(r.verify_ct or 0 for r in known),
            "acceptance_histogram": hist, "histogram_steps": sum(hist),
            "acceptance_per_domain": {d: tau([r for r in known if r.domain == d]) for d in domains},
            "spec_stats_missing": missing}


def summarize_level(records: Sequence[RequestRecord], duration_s: float, *, speculative: bool,
                    block_size: Optional[int] = None) -> Dict[str, Any]:
    """Throughput, latency percentiles, errors (and acceptance when ``speculative``) of one level on one server.

    ``duration_s``: the level's wall time in seconds (> 0). Times in the result are seconds; see the module doc
    for every definition. Raises ValueError for a non-positive duration.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [r for r in records if r.ok]
    errors = [r for r in records if not r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    summary: Dict[str, Any] = {
        "requests": len(records), "completed": len(ok), "errors": len(errors),
        "error_messages": [f"{r.id}: {r.error}" for r in errors][:MAX_ERROR_MESSAGES],
        "duration_s": duration_s, "output_tokens": out_tokens, "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens_per_s": out_tokens / duration_s, "requests_per_s": len(ok) / duration_s,
    }
    summary.update(_stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]))
    summary.update(_stats("itl", [v for r in ok for v in itl_values(r)]))
    summary.update(_stats("tpot", [v for v in map(tpot, ok) if v is not None]))
    summary.update(_stats("e2e_latency", [r.latency_s for r in ok]))
    if speculative:
        summary.update(acceptance(records, block_size))
        summary.update(_stats("verify_step", [v for v in map(verify_step_s, ok) if v is not None]))
    return summary


def speedup(spec: Mapping[str, Any], base: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """Ratios speculative over baseline (> 1 = speculative better): throughput, requests/s, ITL and TPOT p50.

    ``verify_cost_ratio`` = speculative verify step p50 / baseline TPOT p50: what one draft + verify step costs
    in plain decode steps; the drafter must reach tau above it to win (break-even tau).
    """
    def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return a / b if a is not None and b else None

    return {"output_tokens_per_s": ratio(spec.get("output_tokens_per_s"), base.get("output_tokens_per_s")),
            "requests_per_s": ratio(spec.get("requests_per_s"), base.get("requests_per_s")),
            "itl_p50": ratio(base.get("itl_p50_s"), spec.get("itl_p50_s")),
            "tpot_p50": ratio(base.get("tpot_p50_s"), spec.get("tpot_p50_s")),
            "ttft_p50": ratio(base.get("ttft_p50_s"), spec.get("ttft_p50_s")),
            "verify_cost_ratio": ratio(spec.get("verify_step_p50_s"), base.get("tpot_p50_s"))}


def ratio_ci(arm: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]], *, n_boot: int = 2000,
             seed: int = 0) -> Dict[str, Any]:
    """Throughput of ``arm`` over ``base`` on the prompts both completed, as sum(tokens) / sum(latency) of each
    (the level's throughput up to the shared factor of the concurrency), with a paired bootstrap 95% interval
    over prompts. Records: ``id``, ``ok``, ``completion_tokens``, ``latency_s``. Raises ValueError without a
    common completed prompt."""
    import numpy as np

    a = {r["id"]: r for r in arm if r["ok"]}
    b = {r["id"]: r for r in base if r["ok"]}
    ids = sorted(set(a) & set(b))
    if not ids:
        raise ValueError("no prompt completed on both servers")
    x = np.array([[a[i]["completion_tokens"], a[i]["latency_s"], b[i]["completion_tokens"], b[i]["latency_s"]]
                  for i in ids], dtype=np.float64)

    def ratio(rows: np.ndarray) -> np.ndarray:
        s = rows.sum(axis=-2)
        return (s[..., 0] / s[..., 1]) / (s[..., 2] / s[..., 3])

    idx = np.random.default_rng(seed).integers(0, len(ids), size=(n_boot, len(ids)))
    lo, hi = np.quantile(ratio(x[idx]), [0.025, 0.975])
    return {"mean": float(ratio(x)), "ci95": [float(lo), float(hi)], "prompts": len(ids)}
