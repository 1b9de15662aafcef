"""``torch.ops.sgl_kernel.*`` GDN ops of sgl-kernel's CPU build, registered with ``torch.library`` (schemas as in
sgl-kernel's ``csrc/cpu/torch_extension_cpu.cpp``, extended with the keyword arguments SGLang 0.5.23's verify call
site passes). The implementations are the torch functions of :mod:`sgl_kernel.mamba`. Imported by the package
``__init__`` so the ops exist before SGLang's ``gdn_backend`` / ``gdn_triton`` read them at import time.
"""

from __future__ import annotations

import torch

from . import mamba

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
}


def _fused_gdn_gating(A_log, a, b, dt_bias):
    return mamba.fused_gdn_gating_cpu(A_log, a, b, dt_bias)


_IMPLS = {
    "fused_gdn_gating_cpu": _fused_gdn_gating,
    "fused_sigmoid_gating_delta_rule_update_cpu": mamba.fused_sigmoid_gating_delta_rule_update_cpu,
}

for _name, _schema in _SCHEMAS.items():
    if not hasattr(torch.ops.sgl_kernel, _name):  # idempotent: tests may load the stand-in more than once
        _LIB.define(_name + _schema)
        _LIB.impl(_name, _IMPLS[_name], "CPU")
del _name, _schema
