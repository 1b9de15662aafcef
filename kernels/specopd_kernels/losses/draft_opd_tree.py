"""Draft-OPD's loss over proposal trees: the recorded block of each verify step is a branch at its anchor.

Draft-OPD (bingyang-lei/Draft-OPD) replays the drafter at the anchors of real speculative-decoding rollouts and
supervises the proposed block there: forward KL(p || q) on the accepted slots, reverse KL(q || p) on the rejected
ones weighted gamma^(k-1) by the in-block slot k. Here a slot is "rejected" when it is the first rejected slot of
its block or lies after it within the block: the target scores those slots on the drafter-generated prefix
(including the rejected tokens), as the reference's rejected-draft stream does (it carries the first rejected
token and, in its later variants, the post-reject tokens with their 1-based in-block offsets;
verl/verl/trainer/distillation/losses.py ``_build_rejected_draft_position_weights``: weight
decay^(offset - 1)). Slots neither accepted nor rejected (e.g. past the end of a rollout) are not supervised.
"""

from __future__ import annotations

from typing import Optional

import torch

from .naive import draft_opd_terms
from .tree import _check, tree_alpha

__all__ = ["tree_draft_opd", "block_slot_masks"]


def block_slot_masks(accepted: torch.Tensor, g: int, rejected: bool = True, first_rejected_only: bool = False
                     ) -> tuple:
    """Per-block slot masks from accepted counts.

    accepted: int64 ``[N]`` (0..g, the verify step's accepted drafts); g: drafted slots per block. Returns
    ``(accepted_mask, rejected_mask)``, bool ``[N, g]``: slot k (1-based) is accepted when k <= accepted, rejected
    when k > accepted (the first rejected slot accepted + 1 and every slot after it in the block; blocks with
    accepted = g have none). ``rejected=False`` leaves the rejected mask empty; ``first_rejected_only`` keeps only
    slot accepted + 1 in it (for a drafter whose slots do not see the drafted tokens before them, e.g. DFlash: the
    target's p after a rejection conditions on a prefix the drafter never serves from). Raises ValueError for
    counts outside [0, g].
    """
    if accepted.dim() != 1 or (accepted.numel() and (int(accepted.min()) < 0 or int(accepted.max()) > g)):
        raise ValueError(f"accepted counts must be a 1-D tensor in [0, {g}]")
    k = torch.arange(g, device=accepted.device)[None, :]
    acc = k < accepted[:, None]
    if not rejected:
        return acc, torch.zeros_like(acc)
    return acc, (k == accepted[:, None]) if first_rejected_only else ~acc


def tree_draft_opd(target_rows, draft_logits, row_draft, row_index, with_alpha: bool = True, *,
                   accepted_mask: Optional[torch.Tensor] = None, rejected_mask: Optional[torch.Tensor] = None,
                   gamma: float = 0.8, lambda_acc: float = 1.0, lambda_rej: float = 1.0,
                   log_prob_min: Optional[float] = -10.0, loss_max: Optional[float] = 10.0,
                   accepted_kl: str = "forward", rejected_kl: str = "reverse", **_):
    """Draft-OPD over N branches x G slots of proposal trees (``row_index`` into R scored rows).

    target_rows: ``[R, V]`` target logits; draft_logits: ``[Q, V]`` drafter logits, one per (anchor, slot);
    row_draft: int64 ``[R]``; row_index: int64 ``[N, G]`` (as :func:`specopd_kernels.losses.tree.tree_alpha`);
    accepted_mask / rejected_mask: bool ``[N, G]``, disjoint (see :func:`block_slot_masks`). Equal in value and
    gradient to :func:`specopd_kernels.losses.naive.draft_opd_loss` on the expanded ``[N, G, V]`` tensors with the
    same masks and options (gamma, lambdas, clamps, KL directions). Only the supervised (branch, slot) pairs are
    gathered (``[M, V]``). Returns ``(loss fp32 scalar, alpha [N, G] detached or None)``. Raises ValueError on bad
    shapes or indices, missing, misshapen or overlapping masks.
    """
    _check(target_rows, draft_logits, row_draft, row_index)
    masks = []
    for nm, m in (("accepted_mask", accepted_mask), ("rejected_mask", rejected_mask)):
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.shape != row_index.shape:
            raise ValueError(f"loss 'draft_opd' needs {nm}: bool {tuple(row_index.shape)}, got "
                             f"{None if m is None else (getattr(m, 'dtype', None), tuple(getattr(m, 'shape', ())))}")
        masks.append(m.to(row_index.device))
    acc, rej = masks
    if (acc & rej).any():
        raise ValueError("accepted_mask and rejected_mask overlap: a token is either accepted or rejected")
    sel = acc | rej
    rows = row_index[sel]  # [M]
    slot = torch.arange(row_index.shape[1], device=row_index.device).expand(row_index.shape)[sel]
    loss = draft_opd_terms(target_rows[rows], draft_logits[row_draft[rows]], acc[sel], slot, gamma, lambda_acc,
                           lambda_rej, log_prob_min, loss_max, accepted_kl, rejected_kl)
    if not with_alpha:
        return loss, None
    with torch.no_grad():
        return loss, tree_alpha(target_rows, draft_logits.detach(), row_draft, row_index)
