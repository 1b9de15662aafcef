"""Chunked (WY-form) gated delta rule in plain torch: the prefix pass of indexed state replay, keeping the state
at every chunk boundary. Same values as :func:`specopd_kernels.gdn.naive.gdn_recurrent_naive`.

Derivation (fla ``chunk_gated_delta_rule``, Yang et al. "Gated Delta Networks" Sec. 3.3; written here in the
[Dk, Dv] orientation A = S^T of the [HV, Dv, Dk] state). Inside a chunk of C tokens with cumulative log-decay
gamma_i = g_1 + ... + g_i and entry state A_0, the rule ``A_i = exp(g_i) A_{i-1} + k_i u_i^T`` with
``u_i = beta_i (v_i - exp(g_i) A_{i-1}^T k_i)`` unrolls to ``A_i = exp(gamma_i) A_0 + sum_{j<=i} exp(gamma_i -
gamma_j) k_j u_j^T``, so the new values U [C, Dv] solve the unit lower-triangular system

    (I + M) U = diag(beta) V - diag(beta exp(gamma)) K A_0,   M_ij = beta_i exp(gamma_i - gamma_j) k_i.k_j (j < i)

and ``o_i = exp(gamma_i) A_0^T q_i + sum_{j<=i} exp(gamma_i - gamma_j) (q_i.k_j) u_j``, ``A_C = exp(gamma_C) A_0 +
sum_j exp(gamma_C - gamma_j) k_j u_j^T``. The system is solved once for all chunks (independent of A_0); only
the C x Dk x Dv state products run chunk after chunk. Every exponent is <= 0 (masked before ``exp``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .naive import prepare_qk

__all__ = ["DEFAULT_CHUNK", "gdn_chunk", "gdn_chunk_prepared"]

DEFAULT_CHUNK = 64  # fla / SGLang CHUNK_SIZE


def gdn_chunk_prepared(qn: torch.Tensor, kn: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       state: torch.Tensor, chunk_size: int = DEFAULT_CHUNK
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule on prepared inputs (fp32 math).

    qn, kn: fp32 [T, HV, Dk] from :func:`~specopd_kernels.gdn.naive.prepare_qk`; v: [T, HV, Dv]; g, beta: [T, HV];
    state: [HV, Dv, Dk]. Returns (o fp32 [T, HV, Dv], final state fp32 [HV, Dv, Dk], boundary states fp32
    [T // C + 1, HV, Dv, Dk]: entry j is the state after the first j * C tokens, entry 0 = ``state``).
    Raises ValueError if chunk_size < 1."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    t, hv, dk = qn.shape
    dv = v.shape[-1]
    c = chunk_size
    n = -(-t // c)
    pad = n * c - t  # padded tokens: g = 0, beta = 0, k = v = 0 leave the state unchanged

    def chunks(x):  # [T, HV, ...] -> [HV, n, C, ...]
        x = F.pad(x.float(), (0, 0) * (x.dim() - 2) + (0, 0, 0, pad))
        return x.reshape(n, c, hv, *x.shape[2:]).movedim(2, 0)

    q, k, vv, gg, bb = (chunks(x) for x in (qn, kn, v, g, beta))
    gam = gg.cumsum(-1)  # [HV, n, C]
    lower = torch.ones(c, c, dtype=torch.bool, device=qn.device).tril()
    decay = (gam[..., :, None] - gam[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [HV, n, C, C]
    eye = torch.eye(c, device=qn.device)
    strict = torch.ones(c, c, dtype=torch.bool, device=qn.device).tril(-1)
    m = (bb[..., :, None] * (k @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0)
    u0 = torch.linalg.solve_triangular(eye + m, bb[..., None] * vv, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(eye + m, (bb * gam.exp())[..., None] * k, upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay  # [HV, n, C, C], lower incl. the diagonal
    q_dec = q * gam.exp()[..., None]
    k_dec = k * (gam[..., -1:] - gam).exp()[..., None]
    a = state.float().transpose(-1, -2)  # [HV, Dk, Dv]
    bounds, outs = [a], []
    for i in range(n):
        u = u0[:, i] - w[:, i] @ a  # [HV, C, Dv]
        outs.append(q_dec[:, i] @ a + qk[:, i] @ u)
        a = gam[:, i, -1, None, None].exp() * a + k_dec[:, i].transpose(-1, -2) @ u
        bounds.append(a)
    o = torch.stack(outs, 1).reshape(hv, n * c, dv)[:, :t].transpose(0, 1) if n else v.new_zeros(0, hv, dv).float()
    full = torch.stack(bounds[: t // c + 1]).transpose(-1, -2)
    return o, a.transpose(-1, -2).contiguous(), full.contiguous()


def gdn_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              initial_state: Optional[torch.Tensor] = None, scale: Optional[float] = None,
              use_qk_l2norm: bool = True, chunk_size: int = DEFAULT_CHUNK
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule over one sequence, same arguments and values as
    :func:`~specopd_kernels.gdn.naive.gdn_recurrent_naive` (q, k [T, H, Dk]; v [T, HV, Dv]; g, beta [T, HV];
    initial_state [HV, Dv, Dk]). Returns (o [T, HV, Dv] in v's dtype, final state fp32 [HV, Dv, Dk], boundary
    states fp32 [T // C + 1, HV, Dv, Dk], see :func:`gdn_chunk_prepared`)."""
    t, hv, dv = v.shape
    dk = q.shape[-1]
    scale = dk ** -0.5 if scale is None else float(scale)
    qn, kn = prepare_qk(q, k, hv, scale, use_qk_l2norm)
    state = torch.zeros(hv, dv, dk, device=v.device) if initial_state is None else initial_state
    o, final, bounds = gdn_chunk_prepared(qn, kn, v, g, beta, state, chunk_size)
    return o.to(v.dtype), final, bounds
