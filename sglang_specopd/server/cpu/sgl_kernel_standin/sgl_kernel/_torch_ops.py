"""``torch.ops.sgl_kernel.*`` GDN and Qwen3.5 ops of sgl-kernel's CPU build, registered with ``torch.library``
(schemas as in sgl-kernel's ``csrc/cpu/torch_extension_cpu.cpp``, extended with the keyword arguments SGLang
0.5.23's verify call site passes; the Qwen3.5 ones as SGLang's CPU call sites use them). The implementations are
the torch functions of :mod:`sgl_kernel.mamba` and :mod:`sgl_kernel.qwen3_5`. Imported by the package ``__init__``
so the ops exist before SGLang's ``gdn_backend`` / ``gdn_triton`` / ``models/qwen3_5`` read them at import time.
"""

from __future__ import annotations

import torch

from . import mamba, qwen3_5

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")

_SCHEMAS = {
    "fused_gdn_gating_cpu": "(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)",
    "fused_sigmoid_gating_delta_rule_update_cpu": (
        "(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, "
        "Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, float softplus_beta=1.0, float softplus_threshold=20.0, "
        "bool is_kda=False, bool disable_state_update=False, Tensor(b!)? intermediate_states_buffer=None, "
        "Tensor? intermediate_state_indices=None, int? cache_steps=None, Tensor? retrieve_parent_token=None"
        ") -> Tensor"
    ),
    # Qwen3.5 / Qwen4-Exp attention and GDN projections (models/qwen3_5.py binds them at import on CPU)
    "fused_sigmoid_mul_cpu": "(Tensor(a!) x, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu": (
        "(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim) -> (Tensor, Tensor)"),
    "fused_qk_gemma_rmsnorm_with_gate_cpu": (
        "(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim, int num_heads) "
        "-> (Tensor, Tensor, Tensor)"),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": (
        "(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, int num_heads_v, int head_qk, int head_v) "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
}


def _fused_gdn_gating(A_log, a, b, dt_bias):
    return mamba.fused_gdn_gating_cpu(A_log, a, b, dt_bias)


_IMPLS = {
    "fused_gdn_gating_cpu": _fused_gdn_gating,
    "fused_sigmoid_gating_delta_rule_update_cpu": mamba.fused_sigmoid_gating_delta_rule_update_cpu,
    "fused_sigmoid_mul_cpu": qwen3_5.fused_sigmoid_mul_cpu,
    "fused_qk_gemma_rmsnorm_cpu": qwen3_5.fused_qk_gemma_rmsnorm_cpu,
    "fused_qk_gemma_rmsnorm_with_gate_cpu": qwen3_5.fused_qk_gemma_rmsnorm_with_gate_cpu,
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": qwen3_5.fused_qkvzba_split_reshape_cat_contiguous_cpu,
}

for _name, _schema in _SCHEMAS.items():
    if not hasattr(torch.ops.sgl_kernel, _name):  # idempotent: tests may load the stand-in more than once
        _LIB.define(_name + _schema)
        _LIB.impl(_name, _IMPLS[_name], "CPU")
del _name, _schema
