"""Torch versions of the four ``torch.ops.sgl_kernel`` ops SGLang 0.5.23's ``models/qwen3_5.py`` binds at import
time on a CPU device (``qwen3_5.py:283-297``), which ``qwen4_exp.py`` (Qwen4-Exp: GDN + QSA targets) reuses.
Without them the module raises ``AttributeError`` at import and the model registry drops both architectures.

Semantics follow the kernels SGLang uses on GPU (plan Q1, ``docs/qsa_serving_plan.md``):
- :func:`fused_sigmoid_mul_cpu`: ``sglang/kernels/ops/elementwise/elementwise.py::fused_sigmoid_mul``.
- :func:`fused_qk_gemma_rmsnorm_cpu` / :func:`fused_qk_gemma_rmsnorm_with_gate_cpu`:
  ``sglang/srt/models/utils.py`` (the Triton kernels of the same names). Gemma RMSNorm per head,
  ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` in fp32. The Triton kernels round their output to bf16 / fp16 even for
  fp32 inputs; these return the input dtype unrounded, so an fp32 CPU server matches transformers' fp32.
- :func:`fused_qkvzba_split_reshape_cat_contiguous_cpu`:
  ``sglang/kernels/ops/attention/triton_gdn_fused_proj.py::fused_qkvzba_split_reshape_cat_contiguous``.
"""

from __future__ import annotations

import torch


def fused_sigmoid_mul_cpu(x: torch.Tensor, gate: torch.Tensor) -> None:
    """``x *= sigmoid(gate)`` in place (the attention output gate).

    Args:
        x: ``[T, H*D]`` attention output (any float dtype), modified in place.
        gate: ``[T, H*D]`` or a strided ``[T, H, D]`` view of the same elements.
    Raises:
        RuntimeError: ``gate`` does not hold ``x.numel()`` elements.
    """
    x.copy_((x.float() * torch.sigmoid(gate.reshape(x.shape).float())).to(x.dtype))


def _gemma_rmsnorm_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())
    return out.to(x.dtype).contiguous()


def fused_qk_gemma_rmsnorm_cpu(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                               eps: float, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head Gemma RMSNorm of q and k.

    Args:
        q: ``[T, Hq*D]`` (may be a strided view from ``qkv.split``); k: ``[T, Hkv*D]``.
        q_weight, k_weight: ``[D]``. eps: the norm epsilon. head_dim: D.
    Returns:
        ``(q_out [T*Hq, D], k_out [T*Hkv, D])``, contiguous, in the input dtypes.
    """
    return (_gemma_rmsnorm_rows(q.reshape(-1, head_dim), q_weight, eps),
            _gemma_rmsnorm_rows(k.reshape(-1, head_dim), k_weight, eps))


def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                                         k_weight: torch.Tensor, eps: float, head_dim: int,
                                         num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head Gemma RMSNorm of q and k, with q and the output gate interleaved per head in ``q_gate``.

    Args:
        q_gate: ``[T, Hq*2*D]``, per head ``[q_h (D) | gate_h (D)]`` (may be a strided view).
        k: ``[T, Hkv*D]``. q_weight, k_weight: ``[D]``. eps: norm epsilon. head_dim: D. num_heads: Hq.
    Returns:
        ``(q_out [T*Hq, D], k_out [T*Hkv, D], gate_out [T*Hq, D])``, contiguous; the gate copied unchanged.
    """
    qg = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim)
    q, gate = qg[..., :head_dim], qg[..., head_dim:]
    q_out, k_out = fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim)
    return q_out, k_out, gate.reshape(-1, head_dim).contiguous()


def fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor,
                                                  num_heads_qk: int, num_heads_v: int, head_qk: int,
                                                  head_v: int) -> tuple[torch.Tensor, ...]:
    """Split the GDN input projections (Qwen3.5 contiguous layout).

    Args:
        mixed_qkvz: ``[T, 2*Hk*Dk + 2*Hv*Dv]`` laid out ``[all_q | all_k | all_v | all_z]``.
        mixed_ba: ``[T, 2*Hv]`` laid out ``[all_b | all_a]``.
    Returns:
        ``(mixed_qkv [T, 2*Hk*Dk + Hv*Dv], z [T, Hv, Dv], b [T, Hv], a [T, Hv])``, contiguous.
    """
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    t = mixed_qkvz.shape[0]
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim:qkv_dim + num_heads_v * head_v].reshape(t, num_heads_v, head_v).contiguous()
    return mixed_qkv, z, mixed_ba[:, :num_heads_v].contiguous(), mixed_ba[:, num_heads_v:2 * num_heads_v].contiguous()
