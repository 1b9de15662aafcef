"""SpecOPD's drafter side: the drafter's q at the anchors (one forward; branches are drawn from it), reference
blocks."""

from __future__ import annotations

import torch


def draft_slot_q(drafter, seq, anchors: torch.Tensor, roots: torch.Tensor, head_dtype: str = "float32"):
    """The drafter's q at branch anchors (slots 1..G) and root anchors (slot 1 only) of ``seq``: the object of
    ``drafter.slot_q`` (:mod:`specopd_trainer.drafters.slot_q`: ``sample``, ``greedy``, ``tree_logits``,
    ``root_logits``), for any registered drafter architecture.

    One drafter forward over all A + R blocks (the training mask: each block sees the reference features before
    its anchor); a DFlash drafter runs its last layer and the vocabulary head on the slots the loss uses only (the
    head dominates the drafter's cost). The head matmul runs in ``head_dtype`` (:func:`target_head_logits`: bfloat16
    uses a cached bf16 copy of the frozen head, so an autocast forward does not re-cast the ``[V, H]`` weight every
    call); logits come back fp32 with their graph. ``seq`` has ``features [L, K*H]`` and ``token_ids [L]``;
    anchors / roots: int64 ``[A]`` / ``[R]``.
    """
    from specopd_trainer.loops.head import target_head_logits

    head = drafter._head()
    return drafter.slot_q(seq.features.float(), seq.token_ids, anchors, roots,
                          head=lambda hidden: target_head_logits(head, hidden, head_dtype))


def reference_blocks(token_ids: torch.Tensor, anchors: torch.Tensor, g: int) -> torch.Tensor:
    """The reference continuation of every anchor, int64 ``[A, g]``: ``token_ids[a+1 .. a+g]``, -1 past the end."""
    pos = anchors[:, None] + 1 + torch.arange(g)[None]  # [A, g]
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    return torch.where(pos < ids.numel(), ids[pos.clamp(max=ids.numel() - 1)], torch.full_like(pos, -1))
