"""The tree part of GDN indexed state replay as one Triton kernel (forward only): every node's state from its
parent's state by index, without materialising per-node states.

Grid (root subtrees R, value heads HV, value-row tiles ceil(Dv / BV)). A root subtree is a depth-0 node and its
descendants: subtrees share only their anchor's state (an input, :func:`~specopd_kernels.gdn.replay.replay_prefix`),
so each is an independent program that walks its nodes in topological (packed) order
(:meth:`GDNTreeLayout.walk`), keeping the running state ([BV, Dk] fp32) in registers. The state rows of S [Dv, Dk]
update independently, so value rows are tiled across programs as in fla's ``fused_recurrent`` (BV <= 32 compiled).
Per node: ``q, k`` L2-normalised in fp32 (eps 1e-6), ``q *= scale``, ``S *= exp(g)``,
``u = beta (v - S k)``, ``S += u k^T``, ``o = S q`` (:mod:`specopd_kernels.gdn.naive`). A chain continues from the
registers; a node whose parent is not the previous walk position reloads the parent's state from a scratch
buffer, where only nodes with such a child were stored (chains: no scratch at all; a fan-out node: one slot).
Scratch is written and read by the same program, in the same register layout, with a barrier before a reload.
GQA: value head hv reads q/k head hv // (HV / H).

Kernels are decorated with ``triton.jit`` lazily at first use, cached per value of TRITON_INTERPRET
(:mod:`specopd_kernels.lazy_triton`), so ``TRITON_INTERPRET=1`` runs them on CPU in the tests. Reductions use the
builtin ``tl.reduce`` with the stdlib combine function (a JITFunction called from an interpreted kernel raises in
triton 3.8).

UNVERIFIED ON A GPU: parity is tested under the Triton interpreter only (and the kernel lowers to an sm_90 cubin
in the tests); ``benchmarks/kernels_gpu/run.py`` holds the prepared CUDA check (values vs the torch replay, timing).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..lazy_triton import interpret, lazy_jit
from ..tree.triton_attention import triton_runs_on
from .chunk import DEFAULT_CHUNK
from .layer import GDNParams, GDNTreeOutput
from .layout import GDNTreeLayout
from .replay import finish_replay, replay_prefix

try:  # pragma: no cover - exercised only where triton is absent
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["gdn_tree_nodes_triton", "gdn_tree_replay_triton"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _gdn_tree_kernel(Q, K, V, G, BETA, O, S0, SCRATCH, UNIT_PTR, UNIT_ANCHOR, WALK_NODE, WALK_LOAD, WALK_SAVE,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_ot,
                     stride_oh, STATE_STRIDE, REP, DK, DV, scale,
                     BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr):
    unit = tl.program_id(0)
    hv = tl.program_id(1)
    vb = tl.program_id(2)
    h = hv // REP
    offs_k = tl.arange(0, BK)
    offs_v = vb * BV + tl.arange(0, BV)
    k_ok = offs_k < DK
    v_ok = offs_v < DV
    s_ok = v_ok[:, None] & k_ok[None, :]
    s_off = (hv * DV + offs_v[:, None]).to(tl.int64) * DK + offs_k[None, :]  # inside one [HV, Dv, Dk] state
    w0 = tl.load(UNIT_PTR + unit)
    w1 = tl.load(UNIT_PTR + unit + 1)
    anchor = tl.load(UNIT_ANCHOR + unit).to(tl.int64)
    state = tl.load(S0 + anchor * STATE_STRIDE + s_off, mask=s_ok, other=0.0)
    for w in range(w0, w1):
        node = tl.load(WALK_NODE + w).to(tl.int64)
        src = tl.load(WALK_LOAD + w).to(tl.int64)
        dst = tl.load(WALK_SAVE + w).to(tl.int64)
        if src >= 0:  # the parent is not the previous walk position: its state was saved
            tl.debug_barrier()
            state = tl.load(SCRATCH + src * STATE_STRIDE + s_off, mask=s_ok, other=0.0)
        q = tl.load(Q + node * stride_qt + h * stride_qh + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        k = tl.load(K + node * stride_kt + h * stride_kh + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        v = tl.load(V + node * stride_vt + hv * stride_vh + offs_v, mask=v_ok, other=0.0).to(tl.float32)
        g = tl.load(G + node * stride_gt + hv)
        beta = tl.load(BETA + node * stride_gt + hv)
        if L2NORM:
            q = q / tl.sqrt(tl.reduce(q * q, 0, tl.standard._sum_combine) + 1e-6)
            k = k / tl.sqrt(tl.reduce(k * k, 0, tl.standard._sum_combine) + 1e-6)
        q = q * scale
        state = state * tl.exp(g)
        u = (v - tl.reduce(state * k[None, :], 1, tl.standard._sum_combine)) * beta
        state = state + u[:, None] * k[None, :]
        o = tl.reduce(state * q[None, :], 1, tl.standard._sum_combine)
        tl.store(O + node * stride_ot + hv * stride_oh + offs_v, o.to(O.dtype.element_ty), mask=v_ok)
        if dst >= 0:
            tl.store(SCRATCH + dst * STATE_STRIDE + s_off, state, mask=s_ok)


_KERNELS: dict = {}


def _kernel():
    return lazy_jit(_KERNELS, (_gdn_tree_kernel,), triton is not None,
                    "specopd_kernels.gdn.triton_replay needs triton (pip install triton); use gdn_tree_replay "
                    "instead")[0]


def gdn_tree_nodes_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          anchor_states: torch.Tensor, layout: GDNTreeLayout, scale: float,
                          use_qk_l2norm: bool = True) -> torch.Tensor:
    """Node outputs of the tree part (step 4 of :mod:`specopd_kernels.gdn.replay`) with one Triton launch.

    q, k: [N, H, Dk] and v: [N, HV, Dv], the node rows after the conv (fp32 / bf16 / fp16, any strides with unit
    last stride); g, beta: fp32 [N, HV]; anchor_states: fp32 [A, HV, Dv, Dk] in ``layout.anchors`` order; scale:
    the query scale. Returns [N, HV, Dv] in v's dtype. Raises RuntimeError without triton or for CPU tensors
    without TRITON_INTERPRET=1; TypeError on other dtypes; ValueError on shapes.
    UNVERIFIED on a GPU (interpreter-tested; see ``benchmarks/kernels_gpu/run.py``).
    """
    kernel = _kernel()
    if not triton_runs_on(v.device):
        raise RuntimeError("gdn_tree_nodes_triton got CPU tensors: set TRITON_INTERPRET=1 (tests) or use CUDA")
    if v.dtype not in _DTYPES:
        raise TypeError(f"gdn_tree_nodes_triton supports fp32/bf16/fp16, got {v.dtype}")
    n, hv, dv = v.shape
    h, dk = q.shape[1:]
    if n != layout.num_nodes or q.shape != (n, h, dk) or k.shape != q.shape or hv % h:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match [N={n}, H, Dk], "
                         f"[N, HV, Dv] with HV a multiple of H")
    if g.shape != (n, hv) or beta.shape != (n, hv) or anchor_states.shape[1:] != (hv, dv, dk):
        raise ValueError(f"g {tuple(g.shape)} / beta {tuple(beta.shape)} must be [N, HV] and anchor_states "
                         f"{tuple(anchor_states.shape)} [A, HV, Dv, Dk]")
    out = torch.empty(n, hv, dv, dtype=v.dtype, device=v.device)
    if n == 0:
        return out
    dev, plan = v.device, layout.walk()
    walk = layout.cache.get(("walk", str(dev)))
    if walk is None:
        walk = tuple(x.to(dev) for x in (plan.unit_ptr, plan.unit_anchor, plan.walk_node, plan.walk_load,
                                         plan.walk_save))
        layout.cache[("walk", str(dev))] = walk
    units = walk[1].numel()
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    g, beta = g.float().contiguous(), beta.float().contiguous()
    s0 = anchor_states.float().contiguous()
    scratch = torch.empty(max(1, plan.num_saved), hv, dv, dk, dtype=torch.float32, device=dev)
    bk = triton.next_power_of_2(dk)
    bv = triton.next_power_of_2(dv) if interpret() else min(32, triton.next_power_of_2(dv))
    kernel[(units, hv, triton.cdiv(dv, bv))](
        q, k, v, g, beta, out, s0, scratch, *walk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
        out.stride(0), out.stride(1), hv * dv * dk, hv // h, dk, dv, float(scale),
        BK=bk, BV=bv, L2NORM=bool(use_qk_l2norm), num_warps=1 if bv * bk <= 1024 else 4)  # untuned
    return out


def gdn_tree_replay_triton(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, params: GDNParams,
                           layout: GDNTreeLayout, initial_state: Optional[torch.Tensor] = None,
                           initial_window: Optional[torch.Tensor] = None,
                           chunk_size: int = DEFAULT_CHUNK) -> GDNTreeOutput:
    """:func:`~specopd_kernels.gdn.replay.gdn_tree_replay` with the tree part in Triton (conv, gates, prefix
    pass and anchor replay stay in torch). Same arguments and result; raises as both.
    UNVERIFIED on a GPU."""
    _kernel()  # the "needs triton" error before any work
    prep = replay_prefix(mixed_qkv, a, b, params, layout, initial_state, initial_window, chunk_size)
    p = layout.prefix_len
    node_out = gdn_tree_nodes_triton(prep.q[p:], prep.k[p:], prep.v[p:], prep.g[p:], prep.beta[p:],
                                     prep.anchor_states, layout, params.q_scale, params.use_qk_l2norm)
    return finish_replay(prep, node_out)
