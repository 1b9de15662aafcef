"""SpecOPD's drafter side: slot logits at the anchors (one forward), branches sampled from them, reference blocks."""

from __future__ import annotations

from typing import Tuple

import torch


def sample_branches(draft_logits: torch.Tensor, k: int, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """``k`` branches per block from independent per-slot categorical q: long [nB, k, G]."""
    probs = torch.softmax(draft_logits.detach().float() / temperature, dim=-1)  # [nB, G, V]
    nb, g, v = probs.shape
    flat = probs.reshape(nb * g, v)
    draws = torch.multinomial(flat, k, replacement=True, generator=gen)  # [nB*G, k]
    return draws.view(nb, g, k).permute(0, 2, 1).contiguous()


def draft_slot_logits(drafter, seq, anchors: torch.Tensor, roots: torch.Tensor,
                      head_dtype: str = "float32") -> Tuple[torch.Tensor, torch.Tensor]:
    """Drafter logits for branch anchors (slots 1..G, ``[A, G, V]``) and root anchors (slot 1 only, ``[R, V]``).

    One drafter forward over all A + R blocks (the training mask: each block sees the reference features before
    its anchor), whose last layer runs on the slots the loss uses only (``slots`` of
    :meth:`DFlashDrafter.forward_blocks`), as does the vocabulary head (the head dominates the drafter's cost),
    its matmul in ``head_dtype`` (:func:`target_head_logits`: bfloat16 uses a cached bf16 copy of the frozen head,
    so an autocast forward does not re-cast the ``[V, H]`` weight every call); logits come back fp32 with their
    graph. ``seq`` has ``features [L, K*H]`` and ``token_ids [L]``; anchors / roots: int64 ``[A]`` / ``[R]``.
    """
    a_n, r_n, b = anchors.numel(), roots.numel(), drafter.block_size
    slots = torch.zeros(a_n + r_n, b, dtype=torch.bool)
    slots[:a_n, 1:] = True
    slots[a_n:, 1] = True
    hidden, _ = drafter.block_hidden(seq.features.float(), seq.token_ids, torch.cat([anchors, roots]), slots)
    from specopd_trainer.loops.head import target_head_logits

    head = drafter._head()
    return (target_head_logits(head, hidden[: a_n * (b - 1)].view(a_n, b - 1, -1), head_dtype),
            target_head_logits(head, hidden[a_n * (b - 1):], head_dtype))


def reference_blocks(token_ids: torch.Tensor, anchors: torch.Tensor, g: int) -> torch.Tensor:
    """The reference continuation of every anchor, int64 ``[A, g]``: ``token_ids[a+1 .. a+g]``, -1 past the end."""
    pos = anchors[:, None] + 1 + torch.arange(g)[None]  # [A, g]
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    return torch.where(pos < ids.numel(), ids[pos.clamp(max=ids.numel() - 1)], torch.full_like(pos, -1))
