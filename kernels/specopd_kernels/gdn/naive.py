"""Plain-torch references of the Gated DeltaNet (GDN) layer core: the token-by-token gated delta rule, the short
causal conv1d, and tree scoring the slow way (every node re-runs its whole sequence): the ground truth of
:mod:`specopd_kernels.gdn.replay` and the Triton kernel.

Recurrence (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", ICLR 2025; fla ``fused_recurrent_gated_delta_rule``
as adapted in SGLang ``kernels/ops/attention/fla/fused_recurrent.py``), per value head, in fp32::

    q_t, k_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t / sqrt(|k_t|^2 + 1e-6)     (use_qk_l2norm_in_kernel)
    q_t <- scale * q_t                                                      (scale = Dk ** -0.5, after the norm)
    S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T       (S: [Dv, Dk])
    o_t = S_t q_t

computed as fla does: ``S *= exp(g); u = beta (v - S k); S += u k^T; o = S q``.

State layout: ``[HV, Dv, Dk]`` per sequence (value rows, key columns), SGLang's pool layout
(``ssm_states [slots, HV, V, K]``, what ``chunk_gated_delta_rule`` / ``fused_recurrent`` read and write), so a
state from SGLang's mamba pool is used as ``initial_state`` without a transpose. Upstream fla documents
``[N, H, K, V]`` (the transpose, S^T): there the same rule reads ``S_t = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1}
+ beta_t k_t v_t^T, o_t = S_t^T q_t``. The tree kernel also tiles the value rows, which update independently.

Conv (SGLang ``causal_conv1d_fn`` / ``causal_conv1d_update``): depthwise over the C mixed q/k/v channels,
``y_t = silu(bias + sum_j w[:, j] x_{t - (W-1) + j})``; the conv window is the last W - 1 raw inputs, stored
``[C, W-1]`` oldest first (SGLang ``conv_states`` layout), zeros when there is none.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from .layer import GDNParams, GDNTreeOutput, gdn_gates, split_mixed_qkv
from .layout import GDNTreeLayout, check_gdn_row

__all__ = ["causal_conv1d_naive", "gdn_layer_naive", "gdn_recurrent_naive", "gdn_step", "gdn_tree_naive",
           "l2norm", "prepare_qk"]

L2NORM_EPS = 1e-6  # fla l2norm_fwd / the in-kernel norm of fused_recurrent


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """fp32 ``x / sqrt(sum(x^2, -1) + eps)`` over the last dim (fla ``l2norm_fwd``)."""
    x = x.float()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float,
               use_qk_l2norm: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k [..., H, Dk] -> fp32 [..., HV, Dk]: L2-normalised (if asked), q times ``scale``, each k head repeated
    for its HV / H value heads (value head hv reads head hv // (HV / H)). Raises ValueError if H does not divide
    HV."""
    h = q.shape[-2]
    if num_v_heads % h:
        raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of the q/k heads H={h}")
    q, k = (l2norm(q), l2norm(k)) if use_qk_l2norm else (q.float(), k.float())
    rep = num_v_heads // h
    return (q * scale).repeat_interleave(rep, -2), k.repeat_interleave(rep, -2)


def gdn_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """One gated-delta-rule token for a batch of states (fp32 throughout).

    state: [..., HV, Dv, Dk]; q, k: [..., HV, Dk] from :func:`prepare_qk`; v: [..., HV, Dv]; g, beta: [..., HV].
    Returns (new state [..., HV, Dv, Dk], o [..., HV, Dv])."""
    state = state * g.exp()[..., None, None]
    u = beta[..., None] * (v.float() - (state @ k[..., None])[..., 0])
    state = state + u[..., :, None] * k[..., None, :]
    return state, (state @ q[..., None])[..., 0]


def _zero_state(hv: int, dv: int, dk: int, device) -> torch.Tensor:
    return torch.zeros(hv, dv, dk, dtype=torch.float32, device=device)


def gdn_recurrent_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        initial_state: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                        use_qk_l2norm: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule over one sequence (the module docstring's recurrence).

    q, k: [T, H, Dk]; v: [T, HV, Dv] (HV a multiple of H); g: [T, HV] log-space decay (<= 0); beta: [T, HV];
    initial_state: [HV, Dv, Dk] (zeros if None); scale: default Dk ** -0.5. Returns (o [T, HV, Dv] in v's dtype,
    final state fp32 [HV, Dv, Dk]). Raises ValueError on shape mismatch."""
    t, hv, dv = v.shape
    dk = q.shape[-1]
    if q.shape != k.shape or q.shape[0] != t or g.shape != (t, hv) or beta.shape != (t, hv):
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, "
                         f"beta {tuple(beta.shape)} do not match ([T, H, Dk], [T, HV, Dv], [T, HV])")
    scale = dk ** -0.5 if scale is None else float(scale)
    qn, kn = prepare_qk(q, k, hv, scale, use_qk_l2norm)
    state = _zero_state(hv, dv, dk, v.device) if initial_state is None else initial_state.float()
    if state.shape != (hv, dv, dk):
        raise ValueError(f"initial_state must be [HV, Dv, Dk] = {(hv, dv, dk)}, got {tuple(state.shape)}")
    outs = []
    for i in range(t):
        state, o = gdn_step(state, qn[i], kn[i], v[i], g[i].float(), beta[i].float())
        outs.append(o)
    out = torch.stack(outs) if outs else v.new_zeros(0, hv, dv, dtype=torch.float32)
    return out.to(v.dtype), state


def causal_conv1d_naive(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                        initial_window: Optional[torch.Tensor] = None,
                        activation: Optional[str] = "silu") -> Tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv1d over time with SiLU (SGLang ``causal_conv1d_fn`` semantics, fp32 math).

    x: [T, C]; weight: [C, W]; bias: [C] or None; initial_window: [C, W-1] raw inputs before x, oldest first
    (zeros if None); activation: "silu" or None. Returns (y [T, C] in x's dtype, final window [C, W-1] in x's
    dtype: the last W - 1 raw inputs, reaching into initial_window when T < W - 1). Raises ValueError on shapes
    or an unknown activation."""
    t, c = x.shape
    if weight.dim() != 2 or weight.shape[0] != c:
        raise ValueError(f"weight must be [C={c}, W], got {tuple(weight.shape)}")
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    w1 = weight.shape[1] - 1
    if initial_window is None:
        initial_window = x.new_zeros(c, w1)
    if initial_window.shape != (c, w1):
        raise ValueError(f"initial_window must be [C, W-1] = {(c, w1)}, got {tuple(initial_window.shape)}")
    xx = torch.cat([initial_window.float(), x.float().T], 1)  # [C, W-1+T]
    if t == 0:
        return x.new_zeros(0, c), initial_window.to(x.dtype)
    y = F.conv1d(xx[None], weight.float()[:, None, :], None if bias is None else bias.float(), groups=c)[0].T
    if activation == "silu":
        y = F.silu(y)
    return y.to(x.dtype), xx[:, xx.shape[1] - w1:].to(x.dtype)


def gdn_layer_naive(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, params: GDNParams,
                    initial_state: Optional[torch.Tensor] = None,
                    initial_window: Optional[torch.Tensor] = None) -> GDNTreeOutput:
    """A GDN layer's core over one sequence: conv1d + SiLU, split, gates, recurrence (no output gate / norm).

    mixed_qkv: [T, C]; a, b: [T, HV]; initial_state: fp32 [HV, Dv, Dk]; initial_window: [C, W-1]. Returns a
    :class:`GDNTreeOutput` with output [T, HV, Dv] and the state / window after the T tokens."""
    y, window = causal_conv1d_naive(mixed_qkv, params.conv_weight, params.conv_bias, initial_window)
    q, k, v = split_mixed_qkv(y, params)
    g, beta = gdn_gates(a, b, params)
    o, state = gdn_recurrent_naive(q, k, v, g, beta, initial_state, params.q_scale, params.use_qk_l2norm)
    return GDNTreeOutput(o, state, window)


def _node_chain(parents: List[int], i: int) -> List[int]:
    chain = []
    while i >= 0:
        chain.append(i)
        i = parents[i]
    return chain[::-1]


def gdn_tree_naive(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, params: GDNParams,
                   layout: GDNTreeLayout, initial_state: Optional[torch.Tensor] = None,
                   initial_window: Optional[torch.Tensor] = None) -> GDNTreeOutput:
    """Score a packed row ``[prefix (P) | nodes (N)]`` the slow way: the prefix as one sequence, then for every
    node its own sequence ``prefix[0..anchor] + ancestors + node`` through :func:`gdn_layer_naive` from
    ``initial_state`` / ``initial_window`` (the ground truth; O(N (P + depth)) token steps).

    mixed_qkv: [P+N, C]; a, b: [P+N, HV]; layout: :class:`GDNTreeLayout`. Returns :class:`GDNTreeOutput`
    (output [P+N, HV, Dv]; final state / window after the prefix). Raises ValueError on shapes
    (:func:`~specopd_kernels.gdn.layout.check_gdn_row`)."""
    initial_state, initial_window = check_gdn_row(mixed_qkv, a, b, params, layout, initial_state, initial_window)
    p, n = layout.prefix_len, layout.num_nodes
    pre = gdn_layer_naive(mixed_qkv[:p], a[:p], b[:p], params, initial_state, initial_window)
    outs = [pre.output]
    parents, anchors = layout.node_parent.tolist(), layout.node_anchor.tolist()
    for i in range(n):
        rows = torch.tensor(list(range(anchors[i] + 1)) + [p + j for j in _node_chain(parents, i)],
                            device=mixed_qkv.device)
        res = gdn_layer_naive(mixed_qkv[rows], a[rows], b[rows], params, initial_state, initial_window)
        outs.append(res.output[-1:])
    return GDNTreeOutput(torch.cat(outs), pre.final_state, pre.final_window)
