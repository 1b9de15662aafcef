"""CPU adaptations for hybrid Gated DeltaNet targets (Qwen3-Next architecture) on SGLang 0.5.23's CPU engine.

The GDN kernels themselves are torch stand-ins in ``sgl_kernel_standin/sgl_kernel/mamba.py`` (the CPU build of
sgl-kernel is not installed); this module holds the adaptations that are hooks on SGLang code:

* ``Qwen3GatedDeltaNet.__init__`` builds its gated RMSNorm with ``device=torch.get_device_module()
  .current_device()``: on a torch built with CUDA but no driver (this CI) that initialises CUDA and raises, and on
  a machine with a GPU it would put the norm on the GPU while the CPU engine runs everything else on the CPU.
  During that constructor only, ``torch.get_device_module()`` (no argument) answers ``torch.cpu``.
* ``FusedRMSNormGated.forward`` (the GDN output norm, fla ``fused_norm_gate``) is a Triton kernel unless the CPU
  has AMX (then ``torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu``); for CPU tensors it is computed in torch here.
* ``qwen2_moe.fused_gate_sigmoid_mul_add`` (the MoE block's gated shared expert, used unless the gate runs on
  the AMX backend) is a Triton kernel; for CPU tensors :func:`gate_sigmoid_mul_add` computes it in torch.
* ``scatter_mamba_states_after_mtp_verify`` (commits, after a chain verify, the GDN state and conv window of the
  last accepted draft token from the per-step verify caches into the pool) raises for non-CUDA tensors; for CPU
  pools :func:`scatter_states_after_verify` does it in torch.
"""

from __future__ import annotations

from typing import Optional

import torch


def _cpu_device_module(real):
    def get_device_module(device=None):
        return torch.cpu if device is None else real(device)

    get_device_module._specopd_cpu = True
    return get_device_module


def gdn_init_on_cpu(original_fn, self, *args, **kwargs):
    """AROUND hook for ``Qwen3GatedDeltaNet.__init__`` (registered on the CPU engine only): the layer's modules are
    created on the CPU. Restores ``torch.get_device_module`` afterwards, also when the constructor raises."""
    real = torch.get_device_module
    if getattr(real, "_specopd_cpu", False):  # nested construction: already answering torch.cpu
        return original_fn(self, *args, **kwargs)
    torch.get_device_module = _cpu_device_module(real)
    try:
        return original_fn(self, *args, **kwargs)
    finally:
        torch.get_device_module = real


def rms_norm_gated(x: torch.Tensor, gate: Optional[torch.Tensor], weight, eps: float, activation: str) -> torch.Tensor:
    """Gated RMSNorm of the GDN output (fla ``layer_norm_gated_fwd`` with ``is_rms_norm=True``; HF
    ``Qwen3NextRMSNormGated``): ``y = x / sqrt(mean(x^2) + eps) * weight * act(gate)``, act = ``x * sigmoid(x)``
    for swish/silu or ``sigmoid`` for sigmoid, fp32 math.

    x, gate: [..., D] (same shape; gate None: the plain weighted RMSNorm); weight: [D] or None. Returns [..., D]
    in x's dtype. Raises ValueError for another activation."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if gate is None:
        return y.to(x.dtype)
    gf = gate.float()
    if activation in ("swish", "silu"):
        y = y * gf * torch.sigmoid(gf)
    elif activation == "sigmoid":
        y = y * torch.sigmoid(gf)
    else:
        raise ValueError(f"unsupported gate activation {activation!r}")
    return y.to(x.dtype)


def fused_rms_norm_gated_forward(original_fn, self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    """AROUND hook for ``FusedRMSNormGated.forward``: :func:`rms_norm_gated` for CPU tensors without a residual
    (how Qwen3-Next calls it); anything else goes to SGLang's kernel."""
    if x.device.type != "cpu" or residual is not None or prenorm or getattr(self, "bias", None) is not None:
        return original_fn(self, x, g, residual, prenorm, residual_in_fp32)
    return rms_norm_gated(x, g, self.weight, self.eps, self.activation)


def gate_sigmoid_mul_add(hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor,
                         final_hidden_states: torch.Tensor) -> None:
    """``final += sigmoid(hidden_states @ gate_weight) * shared_output`` in place (SGLang
    ``fused_gate_sigmoid_mul_add``; HF ``Qwen3NextSparseMoeBlock``: ``sigmoid(shared_expert_gate(x)) *
    shared_expert(x)``), fp32 math.

    hidden_states: [T, H]; gate_weight: [H] (the squeezed ``shared_expert_gate`` weight); shared_output,
    final_hidden_states: [T, H]."""
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float())[:, None]
    final_hidden_states.add_((gate * shared_output.float()).to(final_hidden_states.dtype))


def shared_gate_on_cpu(original_fn, hidden_states, gate_weight, shared_output, final_hidden_states):
    """AROUND hook for ``qwen2_moe.fused_gate_sigmoid_mul_add``: :func:`gate_sigmoid_mul_add` for CPU tensors."""
    if hidden_states.device.type != "cpu":
        return original_fn(hidden_states, gate_weight, shared_output, final_hidden_states)
    return gate_sigmoid_mul_add(hidden_states, gate_weight, shared_output, final_hidden_states)


def _scatter_steps(dst, src, dst_rows, steps, src_rows=None) -> None:
    """``dst[:, dst_rows[i]] = src[:, src_rows[i] (default i), steps[i]]`` for every i with ``steps[i] >= 0``
    (SGLang ``fused_mamba_state_scatter_with_mask`` / ``fused_conv_window_scatter_with_mask``)."""
    valid = torch.nonzero(steps >= 0).flatten()
    if valid.numel() == 0:
        return
    rows = valid if src_rows is None else src_rows[valid].long()
    dst[:, dst_rows[valid].long()] = src[:, rows, steps[valid].long()].to(dst.dtype)


def scatter_states_after_verify(mamba_caches, state_indices_tensor, last_correct_step_indices, mamba_track_indices,
                                mamba_steps_to_track, src_indices_raw=None) -> None:
    """Commit the verified GDN states (torch version of SGLang's ``scatter_mamba_states_after_mtp_verify``).

    mamba_caches: SGLang's speculative mamba cache view: ``temporal`` [layers, slots, HV, Dv, Dk],
    ``intermediate_ssm`` [layers, lines, steps, HV, Dv, Dk], ``conv`` / ``intermediate_conv_window`` lists of
    [layers, slots, C, W-1] / [layers, lines, steps, C, W-1]. state_indices_tensor: [B] pool slots;
    last_correct_step_indices: [B] the verify step whose state is kept (< 0: leave the slot alone);
    mamba_track_indices / mamba_steps_to_track: optional extra (slot, step) pairs (radix-cache tracking).
    """
    pairs = []
    if mamba_caches.temporal.numel() > 0:
        pairs.append((mamba_caches.temporal, mamba_caches.intermediate_ssm))
    pairs += [(c, w) for c, w in zip(mamba_caches.conv, mamba_caches.intermediate_conv_window) if c.numel() > 0]
    for dst, src in pairs:
        _scatter_steps(dst, src, state_indices_tensor, last_correct_step_indices, src_indices_raw)
        if mamba_track_indices is not None:
            _scatter_steps(dst, src, mamba_track_indices, mamba_steps_to_track, src_indices_raw)


def scatter_after_verify_on_cpu(original_fn, mamba_caches, state_indices_tensor, last_correct_step_indices,
                                mamba_track_indices, mamba_steps_to_track, src_indices_raw=None):
    """AROUND hook for ``hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify``: torch on CPU."""
    if mamba_caches.temporal.device.type != "cpu":
        return original_fn(mamba_caches, state_indices_tensor, last_correct_step_indices, mamba_track_indices,
                           mamba_steps_to_track, src_indices_raw)
    return scatter_states_after_verify(mamba_caches, state_indices_tensor, last_correct_step_indices,
                                       mamba_track_indices, mamba_steps_to_track, src_indices_raw)


def register_hybrid_gdn_adaptations() -> None:
    """Register the hybrid-GDN hooks with SGLang's HookRegistry (CPU engine only)."""
    from sglang_specopd.server import compat

    compat.hook("Qwen3GatedDeltaNet.__init__", gdn_init_on_cpu)
    compat.hook("FusedRMSNormGated.forward", fused_rms_norm_gated_forward)
    compat.hook("qwen2_moe.fused_gate_sigmoid_mul_add", shared_gate_on_cpu)
    compat.hook("scatter_mamba_states_after_mtp_verify", scatter_after_verify_on_cpu)
