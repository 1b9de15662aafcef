"""Sequential-rollout OPD's rollouts and their loss (same E2E-TV loss as SpecOPD, supervision from real rollouts).

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
                 max_records: Optional[int] = None, head_dtype: str = "bfloat16", temperature: float = 1.0) -> Tuple[torch.Tensor, Dict]:
    """Proposal-tree loss ``loss_name`` (E2E-TV by default) on the recorded blocks of ``rollouts`` (score + features
    in one call); returns (loss, metrics). ``temperature``: the rollouts' sampling temperature (the drafts' law for
    ``e2e_fkl_is``'s acceptance ratios)."""
    from sglang_specopd.wire.protocol import ScoreTreesRequest
    from specopd_kernels.losses import expected_acceptance_length, tree_loss_and_alpha
    from specopd_trainer.loops.branch_tree import pack_branches
    from specopd_trainer.loops.head import target_head_logits

    B = drafter.block_size
    g = B - 1
    refs, kept = [], []
    for r in rollouts:
        recs = [x for x in r.records if x["anchor"] < len(r.token_ids) and len(x["proposed"]) >= g - 1]
        recs = recs[:max_records]  # None = all
        if not recs:
            continue
        # each verify record is a one-branch proposal tree at its anchor: its proposed tokens but the last
        packed = pack_branches(torch.tensor([[x["proposed"][: g - 1]] for x in recs], dtype=torch.long), g - 1)
        trees = [{"anchor": x["anchor"], "tokens": t, "parents": par}
                 for x, t, par in zip(recs, packed.tokens, packed.parents)]
        refs.append({"input_ids": r.token_ids, "trees": trees})
        kept.append((r, recs, packed))
    if not refs:
        raise ValueError("no verify records in these rollouts (is the server speculative?)")
    t0 = time.monotonic()
    scored = client.score_trees(ScoreTreesRequest(references=refs, block_size=B, returns=["hidden"],
                                                  feature_layer_ids=list(layer_ids), output_dtype="float32"))
    t1 = time.monotonic()
    head = drafter._head()
    total, n, taus = 0.0, 0, []
    for (r, recs, packed), sc in zip(kept, scored):
        a = len(recs)
        anchors = torch.tensor([x["anchor"] for x in recs], dtype=torch.long)
        logits, _ = drafter.logits(sc.features.float(), torch.tensor(r.token_ids, dtype=torch.long), anchors)
        with torch.no_grad():
            p_rows = target_head_logits(head, sc.hidden, head_dtype)  # [a + nodes, V]
        # the same proposal-tree loss as SpecOPD (one branch per anchor, so no shared rows)
        loss, alpha = tree_loss_and_alpha(loss_name, p_rows, logits[:, 1:].reshape(a * g, -1),
                                          packed.row_anchor * g + packed.row_slot, packed.row_index,
                                          row_token=packed.row_token, sample_temperature=temperature)
        total = total + loss * a
        n += a
        taus.append(float(expected_acceptance_length(alpha)[1].mean()))
    return total / n, {"est_tau": sum(taus) / len(taus), "supervised_tokens": n * g, "records": n,
                       "score_s": t1 - t0, "loss_s": time.monotonic() - t1}
