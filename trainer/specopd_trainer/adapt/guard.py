"""The deploy guard of ``specopd adapt``: is the candidate better than the deployed drafter on held-out traffic?

Both drafters are measured on the same held-out served requests without deploying either: per request, the greedy
walk of :func:`specopd_trainer.loops.common.greedy_walk_tau` (the drafter proposes a block at the first response
token, the leading slots equal to the served tokens are accepted, the walk advances by accepted + 1; what a T=0
server would emit per verify step on that response), giving (emitted tokens, verify steps). The comparison is the
paired bootstrap of :func:`specopd_trainer.intervals.paired_difference` over those requests (same requests for both,
resampled together; pooled tau = sum emitted / sum steps). At T > 0 the served tokens are samples; the walk then
measures agreement with the sampled continuation, and it favours the drafter that served the request (its accepted
drafts are in the text), so the guard leans towards keeping the deployed drafter.

Rules (:func:`compare`): ``ci`` deploys when the lower end of the 95% interval of (candidate - deployed) is above
``min_gain``; ``mean`` when the mean difference is. A candidate equal to the deployed drafter never deploys under
``ci`` (its interval is [0, 0]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence

import torch

DOMAIN = "traffic"


def walk_rows(drafter, seqs: Sequence, cache: Dict[str, dict] | None = None) -> List[dict]:
    """Per held-out sequence ``{"id", "domain", "completion_tokens", "verify_steps"}`` of the greedy walk of
    ``drafter`` (rows without a step are left out). ``cache``: rows by sequence id, reused and filled (valid while
    the drafter's weights do not change)."""
    from specopd_trainer.loops.common import greedy_walk_tau

    out = []
    was_training = drafter.training
    drafter.eval()
    try:
        with torch.no_grad():
            for s in seqs:
                row = cache.get(s.id) if cache is not None else None
                if row is None:
                    _, emitted, steps = greedy_walk_tau(drafter, s.token_ids, s.features.float(), s.prompt_len)
                    row = {"id": s.id, "domain": DOMAIN, "completion_tokens": int(emitted), "verify_steps": int(steps)}
                    if cache is not None:
                        cache[s.id] = row
                if row["verify_steps"] > 0:
                    out.append(row)
    finally:
        drafter.train(was_training)
    return out


def pooled_tau(rows: Sequence[Mapping[str, Any]]) -> float:
    """sum emitted / sum verify steps (nan for no rows)."""
    steps = sum(r["verify_steps"] for r in rows)
    return sum(r["completion_tokens"] for r in rows) / steps if steps else float("nan")


@dataclass(frozen=True)
class Verdict:
    """One comparison: candidate and deployed pooled tau, the paired difference (mean, 95% interval), how many
    requests, whether the rule deploys, and why (one line)."""

    candidate_tau: float
    deployed_tau: float
    diff: float
    ci95: tuple
    requests: int
    deploy: bool
    reason: str

    def as_dict(self) -> Dict[str, Any]:
        return {"candidate_tau": self.candidate_tau, "deployed_tau": self.deployed_tau, "diff": self.diff,
                "ci95": list(self.ci95), "requests": self.requests, "deploy": self.deploy, "reason": self.reason}


def compare(cand_rows: Sequence[Mapping[str, Any]], dep_rows: Sequence[Mapping[str, Any]], *, rule: str = "ci",
            min_gain: float = 0.0, seed: int = 0) -> Verdict:
    """The verdict of ``rule`` (ci | mean) on paired rows (matched by id). Raises ValueError for an unknown rule
    or when no request is in both."""
    from specopd_trainer.intervals import paired_difference

    if rule not in ("ci", "mean"):
        raise ValueError(f"deploy rule must be 'ci' or 'mean', got {rule!r}")
    d = paired_difference(cand_rows, dep_rows, [DOMAIN], seed=seed)
    lo, hi = d["ci95"]
    n = d["prompts"][DOMAIN]
    common = {r["id"] for r in cand_rows} & {r["id"] for r in dep_rows}
    ct = pooled_tau([r for r in cand_rows if r["id"] in common])
    dt = pooled_tau([r for r in dep_rows if r["id"] in common])
    if rule == "ci":
        deploy = lo > min_gain
        why = (f"interval [{lo:+.3f}, {hi:+.3f}] {'above' if deploy else 'not above'} {min_gain:+.3f}")
    else:
        deploy = d["mean"] > min_gain
        why = f"mean {d['mean']:+.3f} {'above' if deploy else 'not above'} {min_gain:+.3f}"
    return Verdict(ct, dt, float(d["mean"]), (float(lo), float(hi)), int(n), bool(deploy), why)


def worse(verdict: Verdict) -> bool:
    """The first drafter of the comparison measured worse than the second beyond the noise (interval below 0)."""
    return verdict.ci95[1] < 0
