"""Fused Triton acceptance alpha = sum_v min(softmax(t)_v, softmax(d)_v) and the E2E-TV loss built on it.

Forward, one program per row, two passes over V in tiles of BLOCK_V:
  pass 1: online max / log-sum-exp for target t and draft d (Milakov & Gimelshein 2018 style);
  pass 2: alpha = sum_v min(p_v, q_v) and c = sum_v q_v 1[q_v < p_v].
Backward w.r.t. the draft logits only (the target is a constant, SpecOPD E2E-TV):
  d alpha / d q_v = 1[q_v < p_v]  =>  d alpha / d d_v = q_v (1[q_v < p_v] - c), one pass, grid (row, tile).
Only per-row fp32 statistics (lse_t, lse_d, c) are saved: no [rows, V] fp32 softmax is materialised; the
only [rows, V] tensor is the gradient itself, in the draft dtype.  Math is fp32 for fp32 / bf16 / fp16
inputs.  Reference: :func:`specopd_kernels.losses.naive.acceptance_alpha`.

Kernels are decorated with ``triton.jit`` lazily at first use, cached per value of TRITON_INTERPRET, so
setting ``TRITON_INTERPRET=1`` any time before the first call runs them on CPU with the interpreter, even if
triton was imported earlier.  For that reason the kernels reduce with the builtin ``tl.reduce`` and the
stdlib combine functions instead of ``tl.max`` / ``tl.sum``: those are ``@jit`` functions frozen at triton
import time, and a JITFunction called from an interpreted kernel raises (triton 3.8).  The interpreter maps
``_elementwise_max`` / ``_sum_combine`` to numpy reductions.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..lazy_triton import interpret, lazy_jit
from .naive import check_pair, e2e_tv_from_alpha

try:  # pragma: no cover - exercised only where triton is absent
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["fused_acceptance_alpha", "fused_e2e_tv_loss", "triton_available"]

MAX_BLOCK_V = 4096


def _alpha_fwd_kernel(T, D, ALPHA, LSE_T, LSE_D, C, stride_t, stride_d, V, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t_ptr = T + row * stride_t
    d_ptr = D + row * stride_d
    offs = tl.arange(0, BLOCK_V)
    m_t = float("-inf")
    s_t = 0.0
    m_d = float("-inf")
    s_d = 0.0
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        msk = idx < V
        t = tl.load(t_ptr + idx, mask=msk, other=float("-inf")).to(tl.float32)
        d = tl.load(d_ptr + idx, mask=msk, other=float("-inf")).to(tl.float32)
        mt_new = tl.maximum(m_t, tl.reduce(t, 0, tl.standard._elementwise_max))
        s_t = s_t * tl.exp(m_t - mt_new) + tl.reduce(tl.exp(t - mt_new), 0, tl.standard._sum_combine)
        m_t = mt_new
        md_new = tl.maximum(m_d, tl.reduce(d, 0, tl.standard._elementwise_max))
        s_d = s_d * tl.exp(m_d - md_new) + tl.reduce(tl.exp(d - md_new), 0, tl.standard._sum_combine)
        m_d = md_new
    lse_t = m_t + tl.log(s_t)
    lse_d = m_d + tl.log(s_d)
    alpha = 0.0
    c = 0.0
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        msk = idx < V
        t = tl.load(t_ptr + idx, mask=msk, other=float("-inf")).to(tl.float32)
        d = tl.load(d_ptr + idx, mask=msk, other=float("-inf")).to(tl.float32)
        p = tl.exp(t - lse_t)
        q = tl.exp(d - lse_d)
        alpha += tl.reduce(tl.minimum(p, q), 0, tl.standard._sum_combine)
        c += tl.reduce(tl.where(q < p, q, 0.0), 0, tl.standard._sum_combine)
    tl.store(ALPHA + row, alpha)
    tl.store(LSE_T + row, lse_t)
    tl.store(LSE_D + row, lse_d)
    tl.store(C + row, c)


def _alpha_bwd_kernel(T, D, GD, GALPHA, LSE_T, LSE_D, C, stride_t, stride_d, stride_gd, V,
                      BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    idx = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    msk = idx < V
    t = tl.load(T + row * stride_t + idx, mask=msk, other=float("-inf")).to(tl.float32)
    d = tl.load(D + row * stride_d + idx, mask=msk, other=float("-inf")).to(tl.float32)
    p = tl.exp(t - tl.load(LSE_T + row))
    q = tl.exp(d - tl.load(LSE_D + row))
    c = tl.load(C + row)
    g = tl.load(GALPHA + row)
    grad = g * q * (tl.where(q < p, 1.0, 0.0) - c)
    tl.store(GD + row * stride_gd + idx, grad.to(GD.dtype.element_ty), mask=msk)


_KERNELS: dict = {}


def triton_available() -> bool:
    """True if triton imports (the fused path still needs CUDA tensors or TRITON_INTERPRET=1)."""
    return triton is not None


def _kernels():
    return lazy_jit(_KERNELS, (_alpha_fwd_kernel, _alpha_bwd_kernel), triton is not None,
                    "specopd_kernels.losses.fused needs triton (pip install triton); use the naive "
                    "acceptance_alpha / e2e_tv_loss instead")


def _block_v(v: int) -> int:
    return min(MAX_BLOCK_V, triton.next_power_of_2(v))


class _FusedAlpha(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target2d: torch.Tensor, draft2d: torch.Tensor) -> torch.Tensor:
        fwd, _ = _kernels()
        rows, v = draft2d.shape
        stats = torch.empty(4, rows, dtype=torch.float32, device=draft2d.device)
        if rows > 0:
            fwd[(rows,)](target2d, draft2d, stats[0], stats[1], stats[2], stats[3],
                         target2d.stride(0), draft2d.stride(0), v, BLOCK_V=_block_v(v))
        ctx.save_for_backward(target2d, draft2d, stats[1], stats[2], stats[3])
        return stats[0]

    @staticmethod
    def backward(ctx, grad_alpha: torch.Tensor):
        target2d, draft2d, lse_t, lse_d, c = ctx.saved_tensors
        _, bwd = _kernels()
        rows, v = draft2d.shape
        grad = torch.empty_like(draft2d)
        if rows > 0:
            bv = _block_v(v)
            bwd[(rows, triton.cdiv(v, bv))](target2d, draft2d, grad, grad_alpha.float().contiguous(), lse_t,
                                             lse_d, c, target2d.stride(0), draft2d.stride(0), grad.stride(0), v,
                                             BLOCK_V=bv)
        return None, grad


def fused_acceptance_alpha(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Fused alpha = sum_v min(softmax(t), softmax(d)) per row, differentiable w.r.t. draft_logits only.

    target_logits, draft_logits: [..., V] on CUDA (or CPU with TRITON_INTERPRET=1), dtype fp32 / bf16 /
    fp16 (math in fp32).  Returns fp32 [...].  The gradient is returned in draft_logits.dtype.
    Raises RuntimeError if triton is missing or CPU tensors are given without TRITON_INTERPRET=1;
    ValueError if target_logits requires grad (it is a constant here: detach it) or shapes differ;
    TypeError on unsupported dtypes.  Source: SpecOPD E2E-TV (d alpha / d q(v) = 1[q(v) < p(v)]).
    """
    check_pair(target_logits, draft_logits)
    for name, x in (("target_logits", target_logits), ("draft_logits", draft_logits)):
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"{name}: fused alpha supports fp32/bf16/fp16, got {x.dtype}")
    if target_logits.requires_grad and torch.is_grad_enabled():
        raise ValueError("fused_acceptance_alpha treats target_logits as a constant: pass target_logits.detach()")
    if target_logits.device != draft_logits.device:
        raise ValueError(f"device mismatch: {target_logits.device} vs {draft_logits.device}")
    _kernels()
    if draft_logits.device.type == "cpu" and not interpret():
        raise RuntimeError("fused kernels got CPU tensors: set TRITON_INTERPRET=1 (tests) or use CUDA tensors")
    v = draft_logits.shape[-1]
    lead = draft_logits.shape[:-1]
    alpha = _FusedAlpha.apply(target_logits.reshape(-1, v).contiguous(), draft_logits.reshape(-1, v).contiguous())
    return alpha.reshape(lead)


def fused_e2e_tv_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor,
                      valid_mask: Optional[torch.Tensor] = None, reduction: str = "mean") -> torch.Tensor:
    """E2E-TV loss with the fused alpha: L = 1 - (1/G) sum_j prod_{i<=j} alpha_i, mean over blocks.

    target_logits, draft_logits: [N, G, V]; valid_mask: optional bool [N, G] (invalid slot = alpha 0, the
    chain stops).  The cumulative product over G is plain torch.  Same contract as
    :func:`specopd_kernels.losses.naive.e2e_tv_loss` except target_logits gets no gradient.  Source: SpecOPD.
    """
    check_pair(target_logits, draft_logits, blocks=True)
    return e2e_tv_from_alpha(fused_acceptance_alpha(target_logits, draft_logits), valid_mask, reduction)
