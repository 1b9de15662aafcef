"""Draft-OPD's replay: the drafter re-run at recorded anchors, the target on the same drafted prefixes, one loss.

1. :func:`select_blocks`: which recorded blocks are replayed: error anchors (blocks with a rejected slot, the
   paper's) or the random-anchor ablation (as many blocks as there are error blocks, drawn uniformly among all
   recorded blocks, with or without a rejection; the same count keeps the supervision budget equal).
2. :func:`draft_opd_step`: each replayed block is a one-branch proposal tree at its anchor (its first G-1
   proposed tokens: the target row after token k-1 gives p for slot k, on the drafter-generated prefix, rejected
   tokens included); ONE ``score_trees`` call for the batch returns the target's hidden states on every row and
   the rollouts' context features, from which the drafter recomputes q at the anchors
   (:mod:`specopd_trainer.algorithms.sequential_opd.rollouts`, shared with sequential OPD); loss ``draft_opd``
   of the loss registry (tree form) with slot masks from the accepted counts
   (:func:`specopd_kernels.losses.draft_opd_tree.block_slot_masks`).
3. :func:`sft_step`: the no-replay ablation, ce_decay SFT on the rollout text at the same anchors (one
   features-only ``score_trees`` call, no target scoring of drafts).
"""

from __future__ import annotations

import time
from typing import Dict, List, Tuple

import torch

from specopd_trainer.algorithms.draft_opd.rollouts import TracedRollout, VerifyRecord

Selected = List[Tuple[TracedRollout, List[VerifyRecord]]]
# the loss option -> KL directions (accepted slots, rejected slots)
KL_DIRECTIONS = {"mixed": ("forward", "reverse"), "fkl_only": ("forward", "forward"),
                 "rkl_only": ("reverse", "reverse")}


def usable(r: TracedRollout, x: VerifyRecord, g: int) -> bool:
    """A record can be replayed: its anchor lies in the rollout and it proposed at least G-1 tokens."""
    return 0 <= x.anchor < len(r.token_ids) and len(x.proposed) >= max(g - 1, 1)


def select_blocks(rollouts: List[TracedRollout], g: int, anchors: str, max_blocks: int,
                  gen: torch.Generator) -> Selected:
    """The blocks to replay, per rollout (order kept). ``anchors``: "error" (records with ``first_rejected``) or
    "random" (as many records as error ones, uniformly among all usable records, drawn with ``gen``). At most
    ``max_blocks`` in all (a uniform subset). Raises ValueError for another ``anchors``."""
    if anchors not in ("error", "random"):
        raise ValueError(f"anchors must be 'error' or 'random', got {anchors!r}")
    pool = [(i, j) for i, r in enumerate(rollouts) for j, x in enumerate(r.records) if usable(r, x, g)]
    errors = [(i, j) for i, j in pool if rollouts[i].records[j].first_rejected is not None]
    chosen = errors
    if anchors == "random":
        chosen = [pool[k] for k in torch.randperm(len(pool), generator=gen)[: len(errors)].tolist()]
    if len(chosen) > max_blocks:
        chosen = [chosen[k] for k in torch.randperm(len(chosen), generator=gen)[:max_blocks].tolist()]
    keep = set(chosen)
    out = []
    for i, r in enumerate(rollouts):
        recs = [x for j, x in enumerate(r.records) if (i, j) in keep]
        if recs:
            out.append((r, recs))
    return out


def rollout_stats(rollouts: List[TracedRollout], g: int) -> Dict:
    """Serving statistics of the (fresh) verify records: ``records``, ``rollout_tau`` (mean accepted + 1, the
    served acceptance length), ``accepted_per_slot`` / ``rejected_per_slot`` (records whose slot k was accepted /
    was the first rejected one or after it, k = 1..G) and ``error_records``."""
    recs = [x for r in rollouts for x in r.records]
    acc = torch.tensor([min(x.accepted, g) for x in recs], dtype=torch.long)
    k = torch.arange(1, g + 1)
    accepted = (acc[:, None] >= k[None, :]).sum(0) if recs else torch.zeros(g, dtype=torch.long)
    return {"records": len(recs), "error_records": sum(x.first_rejected is not None for x in recs),
            "rollout_tau": float((acc.float() + 1).mean()) if recs else None,
            "accepted_per_slot": accepted.tolist(), "rejected_per_slot": (len(recs) - accepted).tolist()}


def draft_opd_step(drafter, client, selected: Selected, layer_ids: List[int], *, loss: str = "mixed",
                   gamma: float = 0.8, lambda_acc: float = 1.0, lambda_rej: float = 1.0,
                   head_dtype: str = "bfloat16", rejected_slots: str = "all") -> Tuple[torch.Tensor, Dict]:
    """The Draft-OPD loss on ``selected`` blocks (one ``score_trees`` call, one tree loss over all blocks); returns
    (loss fp32 scalar with graph, metrics: ``blocks``, ``accepted_tokens``, ``rejected_tokens``,
    ``step_supervised_tokens`` (slots in the loss), ``step_scored_tokens`` (blocks x G: slots the target scored),
    ``est_tau`` (from the replayed blocks' alpha), ``score_s``, ``loss_s``).
    ``loss``: mixed | fkl_only | rkl_only. ``rejected_slots``: all (the paper's) | first (only the first rejected slot
    of a block is supervised; the target still scores the whole block). Raises ValueError for an empty
    ``selected``, an unknown ``loss`` or ``rejected_slots``."""
    from specopd_kernels.losses import expected_acceptance_length, tree_loss_and_alpha
    from specopd_kernels.losses.draft_opd_tree import block_slot_masks
    from specopd_trainer.algorithms.sequential_opd.rollouts import (block_rows, pack_recorded_blocks,
                                                                    score_recorded_blocks)

    if loss not in KL_DIRECTIONS:
        raise ValueError(f"loss must be one of {sorted(KL_DIRECTIONS)}, got {loss!r}")
    if rejected_slots not in ("all", "first"):
        raise ValueError(f"rejected_slots must be 'all' or 'first', got {rejected_slots!r}")
    if not selected:
        raise ValueError("no blocks to replay")
    g = drafter.block_size - 1
    blocks = [pack_recorded_blocks(r.token_ids, [x.as_dict() for x in recs], g) for r, recs in selected]
    t0 = time.monotonic()
    scored = score_recorded_blocks(client, blocks, drafter.block_size, layer_ids)
    t1 = time.monotonic()
    p_parts, q_parts, draft_idx, row_idx = [], [], [], []
    rows = qs = 0
    for b, sc in zip(blocks, scored):
        p_rows, q, row_draft = block_rows(drafter, b, sc, head_dtype)  # q per row on its proposed prefix
        draft_idx.append(row_draft + qs)
        row_idx.append(b.packed.row_index + rows)
        p_parts.append(p_rows)
        q_parts.append(q)
        rows, qs = rows + p_rows.shape[0], qs + q.shape[0]
    accepted = torch.tensor([min(x.accepted, g) for _, recs in selected for x in recs], dtype=torch.long)
    acc_mask, rej_mask = block_slot_masks(accepted, g, first_rejected_only=rejected_slots == "first")
    acc_kl, rej_kl = KL_DIRECTIONS[loss]
    value, alpha = tree_loss_and_alpha(
        "draft_opd", torch.cat(p_parts), torch.cat(q_parts), torch.cat(draft_idx), torch.cat(row_idx),
        accepted_mask=acc_mask, rejected_mask=rej_mask,
        options={"gamma": gamma, "lambda_acc": lambda_acc, "lambda_rej": lambda_rej, "accepted_kl": acc_kl,
                 "rejected_kl": rej_kl})
    n_acc, n_rej = int(acc_mask.sum()), int(rej_mask.sum())
    return value, {"blocks": len(accepted), "accepted_tokens": n_acc, "rejected_tokens": n_rej,
                   "step_supervised_tokens": n_acc + n_rej, "step_scored_tokens": len(accepted) * g,
                   "est_tau": float(expected_acceptance_length(alpha)[1].mean()), "score_s": t1 - t0,
                   "loss_s": time.monotonic() - t1}


def sft_step(drafter, client, selected: Selected, layer_ids: List[int], *, gamma_decay: float = 5.0
             ) -> Tuple[torch.Tensor, Dict]:
    """The no-replay ablation: ce_decay SFT on the rollout text at the ``selected`` anchors (labels: the rollout's
    tokens at anchor+1..anchor+G, i.e. the target's own continuation), context features from ONE features-only
    ``score_trees`` call. Returns (loss, metrics ``blocks``, ``step_supervised_tokens``, ``score_s``,
    ``loss_s``). Raises ValueError for an empty ``selected``."""
    from sglang_specopd.wire.protocol import ScoreTreesRequest
    from specopd_kernels.losses import ce_decay_loss

    if not selected:
        raise ValueError("no blocks to train on")
    t0 = time.monotonic()
    scored = client.score_trees(ScoreTreesRequest(
        references=[{"input_ids": r.token_ids} for r, _ in selected], block_size=drafter.block_size, returns=[],
        feature_layer_ids=list(layer_ids), output_dtype="float32"))
    t1 = time.monotonic()
    logits, labels = [], []
    for (r, recs), sc in zip(selected, scored):
        lg, lb = drafter.logits(sc.features.float(), torch.tensor(r.token_ids, dtype=torch.long),
                                torch.tensor([x.anchor for x in recs], dtype=torch.long))
        logits.append(lg[:, 1:])
        labels.append(lb[:, 1:])
    labels_all = torch.cat(labels)
    value = ce_decay_loss(torch.cat(logits), labels_all, gamma_decay=gamma_decay)
    return value, {"blocks": int(labels_all.shape[0]), "step_supervised_tokens": int((labels_all != -100).sum()),
                   "score_s": t1 - t0, "loss_s": time.monotonic() - t1}
