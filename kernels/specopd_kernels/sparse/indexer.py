"""The QSA indexer's formulas (Qwen4-Exp sparse full-attention layers), shared by every selection path.

Source: the installed SGLang 0.5.23, ``sglang/srt/layers/attention/qsa/`` (see docs/sparse_attention.md for the
file:line references). Per attention layer the indexer has ``Hi`` index query heads and ONE index key head of dim
``Di``; a token at logical position ``p``:
  - index query ``q_p`` [Hi, Di]: q_layernorm (Gemma RMSNorm) then RoPE at ``p`` (computed by the caller);
  - raw index key ``k_p`` [Di] (the projection, before any norm);
  - compressed block keys: every complete group of ``r`` (compress_ratio) tokens ``b*r .. b*r + r - 1`` gives
    ``K_b = rope(gemma_rms_norm(mean_fp32(k_{b*r .. b*r+r-1})), position b*r)`` (:func:`qsa_block_keys`);
  - logits over the ``(p + 1) // r`` complete blocks visible to ``p``:
    ``logit_b = sum_h relu(q_p[h] . K_b) / score_scale`` (score_scale = sqrt(Di) by default), fp32 math;
  - selection: the ``block_topk = budget // r`` highest blocks (all of them when they fit), ties to the lower
    block index (flashinfer ``TieBreak.SMALL``, SGLang's batch-invariant mode), expanded to their tokens, plus the
    tail ``(p + 1) // r * r .. p`` of the incomplete block (at most ``r - 1`` tokens): at most
    ``budget + r - 1`` token positions (:func:`expand_blocks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["QSAConfig", "apply_rope", "expand_blocks", "gemma_rms_norm", "index_keys_2d", "qsa_block_keys",
           "qsa_logits"]


@dataclass(frozen=True, eq=False)
class QSAConfig:
    """One QSA layer's indexer configuration (SGLang ``QSAProfile`` + the k_layernorm / RoPE it applies).

    budget: ``indexer_budget``, tokens selected per query from complete blocks (token_topk). compress_ratio: r,
    tokens per compressed block (``indexer_compress_ratio``, >= 2). k_norm_weight: fp32 [Di] Gemma RMSNorm weight of
    the compressed keys (applied as ``x * (1 + w)``), None = no norm. norm_eps: its epsilon. rotary_dim: RoPE width
    on the first dims of a compressed key (0 = no RoPE); rope_theta, neox_style: as the layer's rotary embedding
    (text positions: MRoPE with equal axes reduces to this). score_scale: logit divisor, default sqrt(Di).
    rope: optional ``rope(x [B, Di], positions int64 [B]) -> [B, Di]`` used instead of the theta formula (a served
    layer passes its own cos / sin cache, so the keys are bit-identical to the server's). score_dtype: optional
    dtype the compressed keys are rounded to after RoPE (SGLang stores them in its bf16 compressed key cache, even
    on an fp32 server, and casts the index query the same way; the caller casts index_q).
    SGLang also requires ``budget // r`` in {512, 2048} (its CUDA top-k widths); any value is accepted here.
    Raises ValueError on r < 2, a budget that is not a positive multiple of r, or an odd rotary_dim.
    """

    budget: int
    compress_ratio: int
    k_norm_weight: Optional[torch.Tensor] = None
    norm_eps: float = 1e-6
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    neox_style: bool = True
    score_scale: Optional[float] = None
    rope: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None
    score_dtype: Optional[torch.dtype] = None

    def __post_init__(self):
        if self.compress_ratio < 2:
            raise ValueError(f"QSA requires compress_ratio >= 2, got {self.compress_ratio}")
        if self.budget <= 0 or self.budget % self.compress_ratio:
            raise ValueError(f"budget must be a positive multiple of compress_ratio, got {self.budget} / "
                             f"{self.compress_ratio}")
        if self.rotary_dim < 0 or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and >= 0, got {self.rotary_dim}")

    @property
    def block_topk(self) -> int:
        """Compressed blocks selected per query: budget // compress_ratio."""
        return self.budget // self.compress_ratio

    @property
    def width(self) -> int:
        """Selected token positions per query at most: budget + compress_ratio - 1 (SGLang's final_topk)."""
        return self.budget + self.compress_ratio - 1


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """SGLang ``GemmaRMSNorm.forward_native``: fp32 ``x * rsqrt(mean(x^2) + eps) * (1 + weight)``, back in x's dtype.

    x: [..., Di]; weight: [Di]. Returns x's shape and dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float,
               neox_style: bool = True) -> torch.Tensor:
    """RoPE on the first ``rotary_dim`` dims of x (SGLang ``apply_rotary_emb``: cos / sin cast to x's dtype).

    x: [n, ..., Di] (any float dtype); positions: int [n]. inv_freq_i = theta^(-2i / rotary_dim), fp32 cos / sin.
    Returns x's shape and dtype; x unchanged when rotary_dim is 0."""
    if rotary_dim == 0 or x.numel() == 0:
        return x
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, device=x.device, dtype=torch.float32) / rotary_dim)
    ang = positions.to(x.device, torch.float32)[:, None] * inv[None, :]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rotary_dim // 2,)
    cos, sin = ang.cos().to(x.dtype).reshape(shape), ang.sin().to(x.dtype).reshape(shape)
    rot = x[..., :rotary_dim]
    x1, x2 = (rot.chunk(2, -1) if neox_style else (rot[..., ::2], rot[..., 1::2]))
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = torch.cat((o1, o2), -1) if neox_style else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((out, x[..., rotary_dim:]), -1)


def index_keys_2d(index_k: torch.Tensor, what: str = "index_k") -> torch.Tensor:
    """Raw index keys as [T, Di]: accepts [T, Di] or SGLang's [T, 1, Di] (one index key head).

    Raises ValueError on other shapes."""
    if index_k.dim() == 3 and index_k.shape[1] == 1:
        return index_k[:, 0]
    if index_k.dim() != 2:
        raise ValueError(f"{what} must be [T, Di] or [T, 1, Di] (QSA has one index key head), got "
                         f"{tuple(index_k.shape)}")
    return index_k


def qsa_block_keys(groups: torch.Tensor, first_positions: torch.Tensor, cfg: QSAConfig) -> torch.Tensor:
    """Compressed block keys from complete groups of raw index keys.

    groups: [B, r, Di] raw index keys of B complete blocks, any float dtype; first_positions: int [B], the logical
    position of each block's first token (b * r). SGLang: ``average_pool_qsa_keys`` (fp32 mean, back to the dtype)
    then ``normalize_compressed_keys`` (k_layernorm, RoPE at the first member's position). Returns [B, Di] in
    groups' dtype (``cfg.score_dtype`` when set). Raises ValueError when the group size is not compress_ratio."""
    if groups.dim() != 3 or groups.shape[1] != cfg.compress_ratio:
        raise ValueError(f"groups must be [B, {cfg.compress_ratio}, Di], got {tuple(groups.shape)}")
    pooled = groups.float().mean(1).to(groups.dtype)
    if cfg.k_norm_weight is not None:
        pooled = gemma_rms_norm(pooled, cfg.k_norm_weight.to(pooled.device), cfg.norm_eps)
    if cfg.rope is not None:
        keys = cfg.rope(pooled, first_positions) if pooled.shape[0] else pooled
    else:
        keys = apply_rope(pooled, first_positions, cfg.rotary_dim, cfg.rope_theta, cfg.neox_style)
    return keys if cfg.score_dtype is None else keys.to(cfg.score_dtype)


def qsa_logits(index_q: torch.Tensor, block_keys: torch.Tensor, cfg: QSAConfig) -> torch.Tensor:
    """Indexer logits of queries against block keys: ``sum_h relu(q[h] . K_b) / score_scale`` in fp32.

    index_q: [R, Hi, Di]; block_keys: [R, B, Di] (per-row keys) or [B, Di] (shared). Returns fp32 [R, B].
    SGLang ``torch_qsa_mqa_prefill`` / ``torch_qsa_mqa_decode`` (mqa.py), weight-free."""
    scale = cfg.score_scale or math.sqrt(index_q.shape[-1])
    eq = "rhd,rbd->rbh" if block_keys.dim() == 3 else "rhd,bd->rbh"
    return torch.relu(torch.einsum(eq, index_q.float(), block_keys.float())).sum(-1) / scale


def expand_blocks(blocks: torch.Tensor, positions: torch.Tensor, cfg: QSAConfig) -> torch.Tensor:
    """Selected blocks -> selected token positions, valid entries first (SGLang ``torch_expand_qsa_block_indices``).

    blocks: int64 [R, block_topk], selected block indices in selection order, -1 = none; positions: int64 [R], each
    query's logical position p. Returns int64 [R, budget + r - 1]: the blocks' tokens ``b*r .. b*r + r - 1`` in
    order, then the tail ``(p + 1) // r * r .. p``, then -1 padding."""
    r = cfg.compress_ratio
    offs = torch.arange(r, device=blocks.device)
    tok = torch.where(blocks[:, :, None] >= 0, blocks[:, :, None] * r + offs, -1).reshape(blocks.shape[0], -1)
    start = (positions + 1) // r * r
    tail = start[:, None] + offs[None, : r - 1]
    tail = torch.where(tail <= positions[:, None], tail, -1)
    out = torch.cat([tok, tail], 1)
    order = torch.argsort((out < 0).to(torch.int8), dim=1, stable=True)
    return out.gather(1, order)
