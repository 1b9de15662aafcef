"""Trainable DFlash decoder layers, numerically matching SGLang 0.5.23 ``sglang/srt/models/dflash.py``.

Module/parameter names follow the checkpoint (``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``,
``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``), so a drafter's ``state_dict``
is the SGLang checkpoint. Formulas and their source:

* RMSNorm (``layers/layernorm.py`` ``RMSNorm.forward_native``): in fp32, ``x * rsqrt(mean(x^2) + eps)``, then
  ``(x * weight)`` cast back to the input dtype.
* q/k norm (``models/utils.py`` ``apply_qk_norm``): RMSNorm over ``head_dim`` per head, before RoPE.
* RoPE (``layers/rotary_embedding/base.py``, neox style): ``inv_freq = 1 / theta^(arange(0, d, 2)/d)`` (fp32),
  ``freqs = pos * inv_freq``; ``x1, x2 = halves``; ``out = [x1 cos - x2 sin, x2 cos + x1 sin]``.
* Attention (``DFlashAttention.forward``): queries from the block tokens; keys/values are the context K/V
  (``kv_proj_only`` of the projected context, k_norm, RoPE at the context positions: worker
  ``_append_target_hidden_sequential``) followed by the block's own K/V; scale ``head_dim ** -0.5``; GQA.
* MLP (``DFlashMLP``): ``down(silu(gate(x)) * up(x))``.
* Layer (``DFlashDecoderLayer``): pre-norm with a residual stream (SGLang fuses add+norm; same sums).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``weight [dim]`` RMSNorm over the last dim (computed in fp32, output in the input dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 ``[N, head_dim // 2]`` for long positions ``[N]`` (SGLang's cos_sin_cache rows)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
                                / head_dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding of ``x [N, heads, head_dim]`` with cos/sin ``[N, head_dim // 2]``."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class DFlashAttention(nn.Module):
    """Block attention over ``[context K/V ; block K/V]`` (names: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, rope_theta: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.rope_theta = heads, kv_heads, head_dim, float(rope_theta)
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def context_kv(self, ctx_hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V ``[T, kv_heads, head_dim]`` of projected context ``[T, H]`` (no input_layernorm, as SGLang)."""
        t = ctx_hidden.shape[0]
        k = self.k_norm(self.k_proj(ctx_hidden).view(t, self.kv_heads, self.head_dim))
        v = self.v_proj(ctx_hidden).view(t, self.kv_heads, self.head_dim)
        return apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, mask: Optional[torch.Tensor], query_rows: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        """Attention output ``[N, H]`` for normed block hidden ``x [N, H]`` (``[M, H]`` with ``query_rows``).

        ``ctx_k/ctx_v [T, kv_heads, head_dim]``; ``mask`` bool ``[N, T + N]`` (True = attend) or None (all);
        ``query_rows`` long ``[M]``: only these rows query (keys and values stay all N block tokens').
        """
        n = x.shape[0]
        k = apply_rope(self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        if query_rows is not None:
            x, cos, sin = x[query_rows], cos[query_rows], sin[query_rows]
            mask = None if mask is None else mask[query_rows]
            n = x.shape[0]
        q = apply_rope(self.q_norm(self.q_proj(x).view(n, self.heads, self.head_dim)), cos, sin)
        keys = torch.cat([ctx_k.to(k.dtype), k], dim=0).transpose(0, 1)  # [kv_heads, T+N, hd]
        values = torch.cat([ctx_v.to(v.dtype), v], dim=0).transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
            attn_mask=None if mask is None else mask.unsqueeze(0).unsqueeze(0),
            scale=self.head_dim ** -0.5, enable_gqa=self.heads != self.kv_heads,
        )  # [1, heads, N, hd]
        return self.o_proj(out[0].transpose(0, 1).reshape(n, self.heads * self.head_dim))


class DFlashMLP(nn.Module):
    """SwiGLU MLP (names: gate_proj, up_proj, down_proj)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    """One draft layer: ``x += attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x))``."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float,
                 rope_theta: float):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = DFlashAttention(hidden, heads, kv_heads, head_dim, eps, rope_theta)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = DFlashMLP(hidden, intermediate)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, mask: Optional[torch.Tensor], query_rows: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        """``[N, H]``, or ``[M, H]`` for ``query_rows``: rows are independent after attention, so the residual and
        the MLP run on the queried rows only (the last layer of a forward that needs some slots only)."""
        h = self.input_layernorm(x)
        x = x if query_rows is None else x[query_rows]
        x = x + self.self_attn(h, cos, sin, ctx_k, ctx_v, mask, query_rows)
        return x + self.mlp(self.post_attention_layernorm(x))
