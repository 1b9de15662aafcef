"""Torch stand-ins for the Gated DeltaNet (GDN) ops of sgl-kernel's CPU build, for hybrid targets (Qwen3-Next).

SGLang 0.5.23 binds these on its CPU engine at import time (``layers/attention/linear/gdn_backend.py``,
``layers/attention/linear/kernels/gdn_triton.py``): ``sgl_kernel.mamba.{causal_conv1d_fn_cpu,
causal_conv1d_update_cpu, chunk_gated_delta_rule_cpu}`` and ``torch.ops.sgl_kernel.{fused_gdn_gating_cpu,
fused_sigmoid_gating_delta_rule_update_cpu}``. Signatures follow those call sites (and sgl-kernel's CPU wrappers
``sgl_kernel/mamba.py`` / ``csrc/cpu/torch_extension_cpu.cpp``); values follow the Triton kernels they replace
(``kernels/ops/mamba/causal_conv1d_triton.py``, ``fused_gdn_gating.py``, fla ``chunk_gated_delta_rule`` and
``fused_sigmoid_gating_recurrent.py``). The math is :mod:`specopd_kernels.gdn` (token recurrence ``gdn_step``,
chunked WY form ``gdn_chunk``, conv ``causal_conv1d_naive``), in fp32.

State layouts are SGLang's mamba pool (non-AMX CPU, contiguous): conv windows ``conv_states [slots, C, W-1]``
(the last W-1 raw inputs, oldest first), recurrent states ``ssm_states [slots, HV, Dv, Dk]``; both are read and
written in place at the request's slot. ``fused_qkvzba_split_reshape_cat_cpu`` is not provided: SGLang calls it
only when the CPU has AMX (``_is_amx_available``), where the real sgl-kernel CPU build is the right choice.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from specopd_kernels.gdn.chunk import gdn_chunk
from specopd_kernels.gdn.naive import causal_conv1d_naive, gdn_step, prepare_qk

__all__ = ["causal_conv1d_fn_cpu", "causal_conv1d_update_cpu", "chunk_gated_delta_rule_cpu",
           "fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu"]


def _bounds(cu_seqlens: torch.Tensor) -> List[int]:
    return [int(x) for x in cu_seqlens.tolist()]


def _act(activation) -> Optional[str]:
    if activation in (None, False):
        return None
    if activation in ("silu", "swish", True):
        return "silu"
    raise ValueError(f"unsupported conv activation {activation!r} (silu or None)")


def causal_conv1d_fn_cpu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                         activation=None, conv_states: Optional[torch.Tensor] = None,
                         has_initial_state: Optional[torch.Tensor] = None,
                         cache_indices: Optional[torch.Tensor] = None,
                         query_start_loc: Optional[torch.Tensor] = None, seq_lens_cpu=None,
                         **unused) -> torch.Tensor:
    """Prefill (varlen) depthwise causal conv1d + SiLU; updates each sequence's conv window in place.

    x: [C, T_total] (SGLang passes ``mixed_qkv.transpose(0, 1)``), sequences packed along T as ``query_start_loc``
    [B+1] says; weight: [C, W]; bias: [C] or None; conv_states: [slots, C, W-1]; has_initial_state: bool [B]
    (False: the window starts at zeros); cache_indices: [B] slots. Returns y [C, T_total] in x's dtype; after
    the call ``conv_states[slot]`` holds the sequence's last W-1 raw inputs (reaching into the old window when the
    sequence is shorter). Raises ValueError on an unknown activation.
    """
    act = _act(activation)
    out = torch.empty_like(x)
    bounds = _bounds(query_start_loc) if query_start_loc is not None else [0, x.shape[1]]
    slots = cache_indices.tolist() if cache_indices is not None else [None] * (len(bounds) - 1)
    init = has_initial_state.tolist() if has_initial_state is not None else [False] * len(slots)
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        if e == s:
            continue
        slot = slots[i]
        window = conv_states[slot] if (conv_states is not None and slot is not None and init[i]) else None
        y, final = causal_conv1d_naive(x[:, s:e].T, weight, bias, window, act)
        out[:, s:e] = y.T
        if conv_states is not None and slot is not None:
            conv_states[slot].copy_(final)
    return out


def causal_conv1d_update_cpu(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                             bias: Optional[torch.Tensor] = None, activation=None,
                             conv_state_indices: Optional[torch.Tensor] = None,
                             intermediate_conv_window: Optional[torch.Tensor] = None,
                             intermediate_state_indices: Optional[torch.Tensor] = None,
                             retrieve_next_token=None, retrieve_next_sibling=None, retrieve_parent_token=None,
                             **unused) -> torch.Tensor:
    """Decode / chain-verify conv1d step: n new tokens per sequence against its stored window (in place).

    x: [B, C] (decode, n = 1) or [B, C, n] (TARGET_VERIFY: the draft block, transposed); conv_state: [slots, C, W-1];
    conv_state_indices: [B] slots (default 0..B-1). The window always advances by the n tokens (as the Triton
    kernel does). intermediate_conv_window [lines, steps, C, W-1] with intermediate_state_indices [B]: the window
    after each of the n tokens is saved there (SGLang restores the accepted one after verification). Returns y in
    x's shape and dtype. Raises NotImplementedError for tree verify (``retrieve_parent_token`` given).
    """
    if retrieve_parent_token is not None:
        raise NotImplementedError("causal_conv1d_update_cpu: tree verify (topk > 1) is not supported on CPU")
    act = _act(activation)
    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    out = torch.empty_like(x3)
    slots = conv_state_indices.tolist() if conv_state_indices is not None else list(range(x3.shape[0]))
    lines = intermediate_state_indices.tolist() if intermediate_state_indices is not None else None
    for i, slot in enumerate(slots):
        if slot < 0:  # padded batch row (PAD_SLOT_ID)
            out[i] = 0
            continue
        window = conv_state[slot]
        if intermediate_conv_window is not None and lines is not None:
            for t in range(x3.shape[2]):
                y, window = causal_conv1d_naive(x3[i, :, t:t + 1].T, weight, bias, window, act)
                out[i, :, t] = y[0]
                intermediate_conv_window[lines[i], t].copy_(window)
        else:
            y, window = causal_conv1d_naive(x3[i].T, weight, bias, window, act)
            out[i] = y.T
        conv_state[slot].copy_(window)
    return out.squeeze(-1) if x.dim() == 2 else out


def fused_gdn_gating_cpu(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
                         softplus_beta: float = 1.0, softplus_threshold: float = 20.0):
    """GDN gates per token and value head (SGLang ``fused_gdn_gating``; Gated DeltaNet, Yang et al. 2025).

    A_log, dt_bias: [HV]; a, b: [T, HV]. Returns (g fp32 [1, T, HV] = -exp(A_log) softplus(a + dt_bias), the
    log-space decay; beta [1, T, HV] = sigmoid(b) in b's dtype).
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float(), beta=softplus_beta,
                                          threshold=softplus_threshold)
    return g.unsqueeze(0), torch.sigmoid(b.float()).to(b.dtype).unsqueeze(0)


def chunk_gated_delta_rule_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, initial_state: torch.Tensor, cu_seqlens: torch.Tensor,
                               head_first: bool = False, use_qk_l2norm_in_kernel: bool = True,
                               initial_state_indices: Optional[torch.Tensor] = None,
                               scale: Optional[float] = None, **unused):
    """Prefill (varlen) gated delta rule, chunked (:func:`specopd_kernels.gdn.chunk.gdn_chunk`), state in place.

    q, k: [1, T, H, Dk]; v: [1, T, HV, Dv]; g, beta: [1, T, HV] (from :func:`fused_gdn_gating_cpu`);
    initial_state: the pool [slots, HV, Dv, Dk]; cu_seqlens: [B+1]; initial_state_indices: [B] slots (default
    0..B-1). Each sequence starts from ``initial_state[slot]`` (SGLang zeroes a fresh request's slot) and writes
    its final state back there. Returns (o [1, T, HV, Dv] in v's dtype, final states [B, HV, Dv, Dk], None: the
    per-chunk states ``h`` are not returned, like sgl-kernel's CPU wrapper). Raises NotImplementedError for
    ``head_first=True``.
    """
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu: head_first=True is not supported")
    bounds = _bounds(cu_seqlens)
    slots = initial_state_indices.tolist() if initial_state_indices is not None else list(range(len(bounds) - 1))
    out = torch.empty(1, q.shape[1], v.shape[2], v.shape[3], dtype=v.dtype, device=v.device)
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        slot = slots[i]
        o, final, _ = gdn_chunk(q[0, s:e], k[0, s:e], v[0, s:e], g[0, s:e].float(), beta[0, s:e].float(),
                                initial_state[slot].float(), scale, use_qk_l2norm_in_kernel)
        out[0, s:e] = o
        initial_state[slot].copy_(final)
    return out, initial_state[torch.as_tensor(slots, dtype=torch.long)], None


def fused_sigmoid_gating_delta_rule_update_cpu(
        A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        a: torch.Tensor, b: torch.Tensor, initial_state_source: torch.Tensor, initial_state_indices: torch.Tensor,
        cu_seqlens: torch.Tensor, use_qk_l2norm_in_kernel: bool = True, softplus_beta: float = 1.0,
        softplus_threshold: float = 20.0, is_kda: bool = False, disable_state_update: bool = False,
        intermediate_states_buffer: Optional[torch.Tensor] = None,
        intermediate_state_indices: Optional[torch.Tensor] = None, cache_steps: Optional[int] = None,
        retrieve_parent_token: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """Decode / chain-verify step: gates fused with the token-by-token gated delta rule (``gdn_step``).

    q, k: [1, T, H, Dk]; v: [1, T, HV, Dv]; a, b: [T, HV]; initial_state_source: pool [slots, HV, Dv, Dk];
    initial_state_indices: [B] slots (< 0: a padded row, zero state, nothing written); cu_seqlens: [B+1].
    Decode writes each sequence's final state back to its slot. TARGET_VERIFY (``disable_state_update=True``)
    leaves the pool alone and saves the state after token t of sequence i at
    ``intermediate_states_buffer[intermediate_state_indices[i], t]`` (t < cache_steps), from which SGLang
    commits the accepted prefix. Returns o [1, T, HV, Dv] in v's dtype.
    Raises NotImplementedError for KDA or tree verify (``retrieve_parent_token``).
    """
    if is_kda or retrieve_parent_token is not None:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: KDA / tree verify not supported")
    g, beta = fused_gdn_gating_cpu(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
    hv, dv, dk = v.shape[2], v.shape[3], q.shape[3]
    qn, kn = prepare_qk(q[0], k[0], hv, dk ** -0.5 if scale is None else float(scale), use_qk_l2norm_in_kernel)
    out = torch.zeros(1, q.shape[1], hv, dv, dtype=v.dtype, device=v.device)
    bounds = _bounds(cu_seqlens)
    lines = intermediate_state_indices.tolist() if intermediate_state_indices is not None else None
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        slot = int(initial_state_indices[i])
        state = (initial_state_source[slot].float() if slot >= 0
                 else torch.zeros(hv, dv, dk, dtype=torch.float32, device=v.device))
        for t in range(s, e):
            state, o = gdn_step(state, qn[t], kn[t], v[0, t], g[0, t], beta[0, t].float())
            out[0, t] = o
            if intermediate_states_buffer is not None and lines is not None and t - s < (cache_steps or e - s):
                intermediate_states_buffer[lines[i], t - s].copy_(state)
        if slot >= 0 and not disable_state_update:
            initial_state_source[slot].copy_(state)
    return out
