"""Bootstrap intervals for acceptance length over held-out prompts, and paired differences between arms.

Every acceptance claim carries an interval (developers' guide; ../shared/notes/results.md): tau of a domain is
SGLang's pooled ratio (completion tokens / verify steps over the domain's requests, as
:func:`specopd_trainer.evaluate.summarize` computes it); the overall figure is the unweighted mean over domains.
The bootstrap resamples prompts with replacement within each domain (stratified, so every replicate keeps each
domain's prompt count); a paired difference resamples the SAME prompts for both arms, which is what makes small
differences between arms measurable when prompts vary much more than arms do. Percentile intervals.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

N_BOOT = 2000


def _table(per_request: Sequence[Mapping[str, Any]], domains: Sequence[str]) -> Dict[str, Dict[str, Tuple[int, int]]]:
    """{domain: {prompt id: (completion tokens, verify steps)}} for requests with at least one verify step."""
    out: Dict[str, Dict[str, Tuple[int, int]]] = {d: {} for d in domains}
    for r in per_request:
        d = r["domain"]
        if d in out and int(r["verify_steps"]) > 0:
            out[d][str(r["id"])] = (int(r["completion_tokens"]), int(r["verify_steps"]))
    return out


def _ci(samples: np.ndarray, level: float) -> List[float]:
    lo, hi = np.quantile(samples, [(1 - level) / 2, 1 - (1 - level) / 2])
    return [float(lo), float(hi)]


def _boot_taus(arrays: Mapping[str, np.ndarray], idx: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Per-domain bootstrap taus: arrays[d] [n_d, 2] (completion, verify), idx[d] [n_boot, n_d] resample indices."""
    return {d: a[idx[d], 0].sum(1) / a[idx[d], 1].sum(1) for d, a in arrays.items()}


def acceptance_intervals(per_request: Sequence[Mapping[str, Any]], domains: Sequence[str], *, n_boot: int = N_BOOT,
                         seed: int = 0, level: float = 0.95) -> Dict[str, Any]:
    """Tau per domain and their mean, each with a ``level`` bootstrap interval over prompts.

    Args:
        per_request: rows with ``id``, ``domain``, ``completion_tokens``, ``verify_steps`` (``evaluate_acceptance``'s
            ``per_request``); rows without verify steps are left out (they carry no acceptance information).
        domains: the domains reported (each must have at least one row). seed: of the resampling (numpy PCG64).

    Returns: ``{domain: tau, ..., "mean": mean tau, "ci95": [lo, hi], "ci95_by_domain": {d: [lo, hi]},
    "prompts": {d: n}}``. Raises ValueError if a domain has no requests with verify steps.
    """
    table = _table(per_request, domains)
    empty = [d for d in domains if not table[d]]
    if empty:
        raise ValueError(f"no evaluated requests with verify steps for {empty}")
    arrays = {d: np.array(list(table[d].values()), dtype=np.float64) for d in domains}
    rng = np.random.default_rng(seed)
    idx = {d: rng.integers(0, len(a), size=(n_boot, len(a))) for d, a in arrays.items()}
    boots = _boot_taus(arrays, idx)
    point = {d: float(a[:, 0].sum() / a[:, 1].sum()) for d, a in arrays.items()}
    mean_boot = np.mean(np.stack([boots[d] for d in domains]), axis=0)
    return {**point, "mean": float(np.mean([point[d] for d in domains])), "ci95": _ci(mean_boot, level),
            "ci95_by_domain": {d: _ci(boots[d], level) for d in domains},
            "prompts": {d: len(arrays[d]) for d in domains}}


def paired_difference(arm: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]], domains: Sequence[str], *,
                      n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95) -> Dict[str, Any]:
    """Mean tau of ``arm`` minus that of ``base`` on the prompts both evaluated, with a paired bootstrap interval.

    Returns ``{"mean": d, "ci95": [lo, hi], "by_domain": {d: {"mean", "ci95"}}, "prompts": {d: n},
    "inside_noise": bool}`` (``inside_noise``: the interval contains 0). Raises ValueError when a domain has no
    prompt in common.
    """
    ta, tb = _table(arm, domains), _table(base, domains)
    common = {d: sorted(set(ta[d]) & set(tb[d])) for d in domains}
    empty = [d for d in domains if not common[d]]
    if empty:
        raise ValueError(f"no prompts evaluated by both arms for {empty}")
    aa = {d: np.array([ta[d][i] for i in common[d]], dtype=np.float64) for d in domains}
    bb = {d: np.array([tb[d][i] for i in common[d]], dtype=np.float64) for d in domains}
    rng = np.random.default_rng(seed)
    idx = {d: rng.integers(0, len(common[d]), size=(n_boot, len(common[d]))) for d in domains}
    ba, bbt = _boot_taus(aa, idx), _boot_taus(bb, idx)
    point = {d: float(aa[d][:, 0].sum() / aa[d][:, 1].sum() - bb[d][:, 0].sum() / bb[d][:, 1].sum())
             for d in domains}
    diff_boot = np.mean(np.stack([ba[d] - bbt[d] for d in domains]), axis=0)
    ci = _ci(diff_boot, level)
    return {"mean": float(np.mean(list(point.values()))), "ci95": ci,
            "by_domain": {d: {"mean": point[d], "ci95": _ci(ba[d] - bbt[d], level)} for d in domains},
            "prompts": {d: len(common[d]) for d in domains}, "inside_noise": bool(ci[0] <= 0.0 <= ci[1])}
