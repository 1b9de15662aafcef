"""DFlash training blocks and attention masks (pure torch, no model weights).

Conventions (SGLang 0.5.23 ``speculative/dflash_worker_v2.py``, ``forward_batch_generation``): at a verify step
the anchor ``a`` is the committed length (``prefix_lens``), the anchor token is the last verified token, at
position ``a``. The drafter's block is ``[token[a], MASK x (B-1)]`` at positions ``a .. a+B-1``; slot ``k``
predicts the token at ``a+k`` (k = 1..B-1). The draft KV cache holds context features (target hidden states)
for positions ``0 .. a-1`` only, and the block's own ``B`` keys; DFlash layers are ENCODER_ONLY (non-causal)
inside the block. Training reproduces that with one forward over many anchors: block ``b`` sees the context
positions ``< anchors[b]`` of its own sequence and all tokens of its own block, nothing of other blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

IGNORE_INDEX = -100


class DrafterInputError(ValueError):
    """Inputs to a drafter or to a mask/block builder that do not fit (bad shapes, anchors out of range)."""


def _as_long(x: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.long)
    if t.ndim != 1:
        raise DrafterInputError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t


def dflash_attention_mask(
    ctx_positions: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    ctx_seq: Optional[torch.Tensor] = None,
    anchor_seq: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """General DFlash training mask, also for several sequences packed into one forward.

    Args:
        ctx_positions: long [T], absolute position of each context row.
        anchors: long [nB], anchor position of each block.
        block_size: B >= 1.
        ctx_seq / anchor_seq: optional long [T] / [nB] sequence ids (default: all one sequence).

    Returns:
        bool [nB*B, T + nB*B]; ``True`` = may attend. Row ``b*B + s`` (slot s of block b) sees context column
        j iff ``ctx_seq[j] == anchor_seq[b]`` and ``ctx_positions[j] < anchors[b]``, and block column
        ``T + b'*B + s'`` iff ``b' == b`` (non-causal inside the block).

    Raises:
        DrafterInputError: non-1-D inputs, mismatched sequence-id lengths, block_size < 1.
    """
    ctx_positions, anchors = _as_long(ctx_positions, "ctx_positions"), _as_long(anchors, "anchors")
    if block_size < 1:
        raise DrafterInputError(f"block_size must be >= 1, got {block_size}")
    t, nb = ctx_positions.numel(), anchors.numel()
    ctx_seq = torch.zeros(t, dtype=torch.long) if ctx_seq is None else _as_long(ctx_seq, "ctx_seq")
    anchor_seq = torch.zeros(nb, dtype=torch.long) if anchor_seq is None else _as_long(anchor_seq, "anchor_seq")
    if ctx_seq.numel() != t or anchor_seq.numel() != nb:
        raise DrafterInputError(f"ctx_seq has {ctx_seq.numel()} ids for {t} context rows, anchor_seq has "
                                f"{anchor_seq.numel()} for {nb} anchors")
    ctx_vis = (ctx_positions[None, :] < anchors[:, None]) & (ctx_seq[None, :] == anchor_seq[:, None])  # [nB, T]
    ctx_vis = ctx_vis.repeat_interleave(block_size, dim=0)  # [nB*B, T]
    block_id = torch.arange(nb).repeat_interleave(block_size)  # [nB*B]
    blk_vis = block_id[:, None] == block_id[None, :]  # [nB*B, nB*B]
    return torch.cat([ctx_vis, blk_vis], dim=1)


def build_dflash_training_mask(ctx_len: int, anchors: torch.Tensor | Sequence[int], block_size: int) -> torch.Tensor:
    """The DFlash training mask for one sequence whose context rows are positions ``0 .. ctx_len-1``.

    Args:
        ctx_len: T, number of context rows (target features for positions 0..T-1).
        anchors: long [nB], each in ``0 .. ctx_len`` (anchor a sees context positions < a).
        block_size: B.

    Returns:
        bool [nB*B, T + nB*B] (see :func:`dflash_attention_mask`).

    Raises:
        DrafterInputError: an anchor outside ``0 .. ctx_len``, or bad shapes.
    """
    anchors = _as_long(anchors, "anchors")
    if anchors.numel() and (int(anchors.min()) < 0 or int(anchors.max()) > ctx_len):
        raise DrafterInputError(f"anchors must lie in 0..{ctx_len} (ctx_len), got {anchors.tolist()}")
    return dflash_attention_mask(torch.arange(int(ctx_len)), anchors, block_size)


def build_dflash_training_mask_loop(ctx_len: int, anchors: Sequence[int], block_size: int) -> torch.Tensor:
    """Loop reference of :func:`build_dflash_training_mask` (plain Python, for tests)."""
    anchors = [int(a) for a in anchors]
    n = len(anchors) * block_size
    rows = []
    for b, a in enumerate(anchors):
        for _ in range(block_size):
            row = [j < a for j in range(ctx_len)]
            row += [(c // block_size) == b for c in range(n)]
            rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(n, ctx_len + n)


@dataclass(frozen=True)
class DFlashBlocks:
    """Block inputs for ``nB`` anchors of one token sequence.

    Attributes:
        input_ids: long [nB, B], ``[token[a], mask_token_id x (B-1)]``.
        positions: long [nB, B], ``a + (0..B-1)``.
        labels: long [nB, B], ``token[a+k]`` for slot k >= 1 inside the sequence, else ``IGNORE_INDEX``
            (slot 0 always ignored: it is the given anchor token).
        anchors: long [nB].
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor
    anchors: torch.Tensor


def make_blocks(token_ids: torch.Tensor, anchors: torch.Tensor | Sequence[int], block_size: int,
                mask_token_id: int) -> DFlashBlocks:
    """Build DFlash blocks at ``anchors`` of ``token_ids`` (long [L]); each anchor must be in ``0 .. L-1``.

    Raises:
        DrafterInputError: token_ids not 1-D, an anchor out of range, block_size < 2.
    """
    tokens, anchors = _as_long(token_ids, "token_ids"), _as_long(anchors, "anchors")
    n = tokens.numel()
    if block_size < 2:
        raise DrafterInputError(f"block_size must be >= 2, got {block_size}")
    if anchors.numel() and (int(anchors.min()) < 0 or int(anchors.max()) >= n):
        raise DrafterInputError(f"anchors must lie in 0..{n - 1} (the anchor token must exist), "
                                f"got {anchors.tolist()}")
    offsets = torch.arange(block_size)
    positions = anchors[:, None] + offsets[None, :]  # [nB, B]
    input_ids = torch.full_like(positions, int(mask_token_id))
    input_ids[:, 0] = tokens[anchors]
    inside = positions < n
    labels = torch.where(inside, tokens[positions.clamp(max=n - 1)], torch.full_like(positions, IGNORE_INDEX))
    labels[:, 0] = IGNORE_INDEX
    return DFlashBlocks(input_ids=input_ids, positions=positions, labels=labels, anchors=anchors)
