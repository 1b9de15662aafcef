"""One Gated DeltaNet (GDN) layer's core, as SGLang runs it for Qwen3-Next-style hybrid targets: weights and head
config (:class:`GDNParams`), the split of the conv'd mixed q/k/v channels, the gates, and the result type of the
tree-scoring functions (:class:`GDNTreeOutput`).

Conventions follow SGLang 0.5.23 (``srt/models/qwen3_next.py``, ``srt/layers/attention/linear/gdn_backend.py``,
``kernels/ops/attention/linear/fused_gdn_gating.py``), which adapts flash-linear-attention (fla):
  - ``mixed_qkv`` [T, C] holds the projected ``[q (H * Dk) | k (H * Dk) | v (HV * Dv)]`` channels, head-major in
    each part, C = 2 H Dk + HV Dv; the short causal conv1d (width W = 4, SiLU) runs over all C channels before
    the split; q has H = num_k_heads heads (num_q_heads = num_k_heads);
  - GQA-style value heads: HV = num_v_heads is a multiple of H, value head ``hv`` reads q/k head ``hv // (HV / H)``;
  - gates per value head: ``g = -exp(A_log) * softplus(a + dt_bias)`` (log-space decay, fp32; softplus with
    beta 1, threshold 20), ``beta = sigmoid(b)`` rounded to b's dtype as ``fused_gdn_gating`` stores it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = ["GDNParams", "GDNTreeOutput", "gdn_gates", "random_gdn_params", "split_mixed_qkv"]


@dataclass(frozen=True, eq=False)
class GDNParams:
    """Weights and head config of one GDN layer (SGLang / Qwen3-Next names).

    conv_weight: [C, W] depthwise causal-conv taps (SGLang ``conv1d.weight`` squeezed to (dim, width); the last
    column multiplies the current token). A_log, dt_bias: [HV]. conv_bias: [C] or None (Qwen3-Next has none).
    scale: the query scale, default ``head_k_dim ** -0.5`` (what SGLang passes). use_qk_l2norm: L2-normalise q
    and k per head before the recurrence (SGLang always passes ``use_qk_l2norm_in_kernel=True``).
    Raises ValueError if HV is not a multiple of H or a weight has the wrong shape.
    """

    conv_weight: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_bias: Optional[torch.Tensor] = None
    scale: Optional[float] = None
    use_qk_l2norm: bool = True

    def __post_init__(self):
        h, hv = self.num_k_heads, self.num_v_heads
        if h <= 0 or hv % h:
            raise ValueError(f"num_v_heads={hv} must be a positive multiple of num_k_heads={h} (GQA)")
        if self.conv_weight.dim() != 2 or self.conv_weight.shape[0] != self.conv_dim:
            raise ValueError(f"conv_weight must be [C={self.conv_dim}, W], got {tuple(self.conv_weight.shape)}")
        if self.conv_bias is not None and tuple(self.conv_bias.shape) != (self.conv_dim,):
            raise ValueError(f"conv_bias must be [{self.conv_dim}], got {tuple(self.conv_bias.shape)}")
        for name in ("A_log", "dt_bias"):
            if tuple(getattr(self, name).shape) != (hv,):
                raise ValueError(f"{name} must be [num_v_heads={hv}], got {tuple(getattr(self, name).shape)}")

    @property
    def conv_dim(self) -> int:
        """C = 2 H Dk + HV Dv, the channels of ``mixed_qkv``."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def conv_width(self) -> int:
        """W, the conv taps (the conv window state keeps the last W - 1 raw inputs)."""
        return int(self.conv_weight.shape[1])

    def to(self, device) -> "GDNParams":
        """The same layer with every weight on ``device`` (dtypes kept)."""
        bias = None if self.conv_bias is None else self.conv_bias.to(device)
        return GDNParams(self.conv_weight.to(device), self.A_log.to(device), self.dt_bias.to(device),
                         self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim, bias, self.scale,
                         self.use_qk_l2norm)

    @property
    def q_scale(self) -> float:
        """The query scale actually applied (``scale`` or ``head_k_dim ** -0.5``)."""
        return 1.0 / math.sqrt(self.head_k_dim) if self.scale is None else float(self.scale)


@dataclass(frozen=True, eq=False)
class GDNTreeOutput:
    """Result of scoring one packed row ``[prefix (P) | nodes (N)]`` through a GDN layer's core.

    output: [P+N, HV, Dv] in mixed_qkv's dtype, the recurrence output ``o`` of every row (a node's is that of
    its own sequence prefix[0..anchor] + ancestors + itself); it still goes through the layer's gated RMSNorm and
    out projection. final_state: fp32 [HV, Dv, Dk], the state after the P prefix tokens; final_window:
    [C, W-1] in mixed_qkv's dtype, the raw inputs of the last W-1 prefix tokens (SGLang ``conv_states`` layout,
    oldest first; initial-window columns where P < W-1).
    """

    output: torch.Tensor
    final_state: torch.Tensor
    final_window: torch.Tensor


def split_mixed_qkv(x: torch.Tensor, params: GDNParams) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split conv'd channels [T, C] into q [T, H, Dk], k [T, H, Dk], v [T, HV, Dv] (views, x's dtype), as
    SGLang's ``torch.split(mixed_qkv, [q_dim, k_dim, v_dim])`` + ``view``. Raises ValueError if C is wrong."""
    t, c = x.shape
    if c != params.conv_dim:
        raise ValueError(f"mixed_qkv has {c} channels, the layer expects {params.conv_dim}")
    h, hv, dk, dv = params.num_k_heads, params.num_v_heads, params.head_k_dim, params.head_v_dim
    q, k, v = torch.split(x, [h * dk, h * dk, hv * dv], dim=-1)
    return q.reshape(t, h, dk), k.reshape(t, h, dk), v.reshape(t, hv, dv)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, params: GDNParams) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decay and write strength per token and value head (SGLang ``fused_gdn_gating``).

    a, b: [T, HV] (the ``in_proj_ba`` outputs). Returns (g fp32 [T, HV] = -exp(A_log) softplus(a + dt_bias), the
    log-space decay, <= 0; beta fp32 [T, HV] = sigmoid(b) rounded to b's dtype). Raises ValueError on shapes.
    """
    hv = params.num_v_heads
    if a.dim() != 2 or a.shape[1] != hv or b.shape != a.shape:
        raise ValueError(f"a and b must both be [T, num_v_heads={hv}], got {tuple(a.shape)}, {tuple(b.shape)}")
    g = -params.A_log.float().exp() * F.softplus(a.float() + params.dt_bias.float(), beta=1.0, threshold=20.0)
    return g, torch.sigmoid(b.float()).to(b.dtype).float()


def random_gdn_params(num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_width: int = 4,
                      decay: Tuple[float, float] = (0.02, 0.5), conv_bias: bool = False, seed: int = 0,
                      dtype=torch.float32, device="cpu") -> GDNParams:
    """A synthetic GDN layer for tests and benchmarks: conv taps ~ N(0, 1 / W), ``A = exp(A_log)`` uniform in
    ``decay`` (Qwen3-Next draws A in (0, 16); small A keeps exp(g) well away from 0 so the state carries over
    many tokens), dt_bias ~ N(0, 0.5). conv weight / bias in ``dtype``; A_log and dt_bias fp32."""
    gen = torch.Generator().manual_seed(seed)
    c = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    lo, hi = decay
    a = lo + (hi - lo) * torch.rand(num_v_heads, generator=gen)
    w = torch.randn(c, conv_width, generator=gen) / math.sqrt(conv_width)
    dt_bias = torch.randn(num_v_heads, generator=gen) * 0.5
    bias = torch.randn(c, generator=gen) * 0.1 if conv_bias else None
    return GDNParams(w.to(device, dtype), a.log().to(device), dt_bias.to(device), num_k_heads, num_v_heads, head_k_dim,
                     head_v_dim, None if bias is None else bias.to(device, dtype))
