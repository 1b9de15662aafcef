"""Masked (tree) attention in plain torch: the CPU path and the reference for GPU kernels (FlashInfer)."""

from __future__ import annotations

import math
from typing import Optional

import torch

__all__ = ["tree_attention_reference"]


def tree_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                             scale: Optional[float] = None) -> torch.Tensor:
    """Softmax attention with an arbitrary boolean mask and GQA, fp32 math.

    q: [T, Hq, D]; k, v: [T, Hkv, D] with Hq a multiple of Hkv (query head h uses kv head h // (Hq/Hkv),
    the HF ``repeat_kv`` convention); mask: bool [T, T], mask[i, j] True = query i may attend to key j
    (e.g. :func:`specopd_kernels.tree.build_tree_mask`).  scale: softmax scale, default 1/sqrt(D).
    Returns [T, Hq, D] in q's dtype.  Memory O(Hq T^2) fp32: use for small rows / tests.
    Raises ValueError on shape mismatch, GQA ratio or a query row with no allowed key; TypeError on a
    non-bool mask.
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [T, H, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    t, hq, d = q.shape
    if k.shape != v.shape or k.shape[0] != t or k.shape[2] != d:
        raise ValueError(f"k/v shape {tuple(k.shape)}/{tuple(v.shape)} incompatible with q {tuple(q.shape)}")
    hkv = k.shape[1]
    if hq % hkv != 0:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool, got {mask.dtype}")
    if mask.shape != (t, t):
        raise ValueError(f"mask must be [{t}, {t}], got {tuple(mask.shape)}")
    if not mask.any(dim=1).all():
        raise ValueError(f"query row {int((~mask.any(dim=1)).nonzero()[0])} may attend to nothing")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rep = hq // hkv
    qf = q.float()
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,shd->hts", qf, kf) * scale
    scores = scores.masked_fill(~mask[None], float("-inf"))
    out = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), vf)
    return out.to(q.dtype)
