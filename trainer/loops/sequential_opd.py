"""Sequential-rollout OPD: the baseline SpecOPD replaces (same E2E-TV loss, supervision from real rollouts).

One step: the current drafter is pushed into the live server (hot swap), real draft-and-verify rollouts run
through the SPECOPD worker at ``temperature`` (``/generate`` with the per-request acceptance trace); each verify
step of the trace is one on-policy state: its anchor and the drafter's proposed block. The blocks are scored by
the target (one ``score_trees`` call: the rollout text as the reference, one branch per recorded block), the
drafter recomputes q at those anchors from the rollout's context features, and the loss is E2E-TV exactly as in
SpecOPD. Supervision arrives one verify step at a time, sequentially, which is what makes it slow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch


@dataclass(frozen=True)
class Rollout:
    """One rollout: full token ids (prompt + generated), prompt length and the verify records."""

    token_ids: List[int]
    prompt_len: int
    records: List[dict]


def collect_rollouts(client, prompts: List[List[int]], *, max_new_tokens: int, temperature: float,
                     concurrency: int = 8) -> List[Rollout]:
    """Generate with the served drafter, asking for traces; one :class:`Rollout` per prompt."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p):
        out = client.generate(p, max_new_tokens=max_new_tokens, temperature=temperature, trace=True)
        return Rollout(token_ids=list(p) + list(out["output_ids"]), prompt_len=len(p),
                       records=out["meta_info"].get("specopd_trace") or [])

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, prompts))


def rollout_step(drafter, client, rollouts: List[Rollout], layer_ids: List[int], loss_name: str = "e2e_tv",
                 max_records: Optional[int] = None, head_dtype: str = "bfloat16") -> Tuple[torch.Tensor, Dict]:
    """E2E-TV on the recorded blocks of ``rollouts`` (score + features in one call); returns (loss, metrics)."""
    from sglang_specopd.protocol import ScoreTreesRequest
    from specopd_trainer.loops.specopd import specopd_loss, target_logits_for_branches

    B = drafter.block_size
    g = B - 1
    refs, kept = [], []
    for r in rollouts:
        recs = [x for x in r.records if x["anchor"] < len(r.token_ids)][:max_records]  # None = all
        if not recs:
            continue
        trees = [{"anchor": x["anchor"], "branches": [x["proposed"][: g - 1]]} for x in recs]
        refs.append({"input_ids": r.token_ids, "trees": trees})
        kept.append((r, recs))
    if not refs:
        raise ValueError("no verify records in these rollouts (is the server speculative?)")
    t0 = time.monotonic()
    scored = client.score_trees(ScoreTreesRequest(references=refs, block_size=B, returns=["hidden"],
                                                  feature_layer_ids=list(layer_ids), output_dtype="float32"))
    t1 = time.monotonic()
    head = drafter._head()
    total, n, taus = 0.0, 0, []
    for (r, recs), sc in zip(kept, scored):
        anchors = torch.tensor([x["anchor"] for x in recs], dtype=torch.long)
        tokens = torch.tensor(r.token_ids, dtype=torch.long)
        logits, _ = drafter.logits(sc.features.float(), tokens, anchors)
        p = target_logits_for_branches(head, sc, len(recs), 1, g, head_dtype)
        loss, m = specopd_loss(logits[:, 1:], p, loss_name)
        total = total + loss * len(recs)
        n += len(recs)
        taus.append(m["est_tau"])
    return total / n, {"est_tau": sum(taus) / len(taus), "supervised_tokens": n * g, "records": n,
                       "score_s": t1 - t0, "loss_s": time.monotonic() - t1}
