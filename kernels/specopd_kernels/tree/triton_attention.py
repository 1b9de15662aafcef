"""Tree attention as one Triton flash-attention kernel (forward only): the GPU path of ``/specopd/score_trees``.

Same contract as :func:`specopd_kernels.tree.tree_attention_grouped` (the plain-torch reference layout): one
packed row ``[prefix (P) | nodes of tree 0 | ...]``, prefix rows causal, a node row of the tree at anchor a
sees prefix columns 0..a and its ancestors-or-self. The grid is (query tiles, Hq): a query tile is either
BLOCK_M prefix rows, or BLOCK_M consecutive slots of one tree (all rows of a tree tile share the anchor, so
they stream the same prefix keys). Each program runs an online softmax (exp2, fp32 statistics and accumulator)
over
  1. prefix key tiles ``[0, visible)`` (visible = the tile's last row + 1 for prefix tiles, anchor + 1 for
     tree tiles), masked per row to ``col < row + 1`` / ``col <= anchor``;
  2. (tree tiles) the tree's own node key tiles up to the tile's last slot (ancestors sit in earlier slots),
     masked by the packed ancestor matrix ``group_anc`` [G, M, M].
The prefix K/V is read in place by every tile (never copied per anchor); GQA maps query head h to kv head
h // (Hq / Hkv). Extra memory: the tile tables (int32 [tiles, 2]) and an int8 copy of ``group_anc``, cached
on the layout. Prefix tiles and tree tiles are two launches of the same kernel: prefix tiles use BLOCK_M = 64,
tree tiles never mix trees, so their BLOCK_M follows the largest tree (16..64 rows).

Kernels are decorated with ``triton.jit`` lazily at first use, cached per value of TRITON_INTERPRET
(:mod:`specopd_kernels.lazy_triton`), so ``TRITON_INTERPRET=1`` runs them on CPU in the tests. Reductions use
the builtin ``tl.reduce`` with the stdlib combine functions (a JITFunction called from an interpreted kernel
raises in triton 3.8). The interpreter's ``tl.dot`` returns garbage for bf16 operands (triton 3.8), so under
the interpreter bf16 tiles are upcast to fp32 before the dots (``DOT_F32``); compiled kernels dot in bf16.

UNVERIFIED ON A GPU: parity is tested under the Triton interpreter only; ``benchmarks/kernels_gpu/run.py`` holds the
prepared CUDA check (values vs the reference, timing vs the grouped torch path and a dense-mask SDPA).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ..lazy_triton import interpret, lazy_jit
from .layout import TreeLayout, check_tree_row

try:  # pragma: no cover - exercised only where triton is absent
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["check_triton_call", "tree_attention_triton", "triton_available", "triton_runs_on"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _tree_attn_fwd_kernel(Q, KP, VP, KN, VN, O, TILES, GROUP_NODES, GROUP_ANCHOR, GROUP_SIZE, GROUP_ANC,
                          stride_qt, stride_qh, stride_kpt, stride_kph, stride_vpt, stride_vph,
                          stride_knt, stride_knh, stride_vnt, stride_vnh, stride_ot, stride_oh,
                          P, M, QBASE, REP, HEAD_DIM, qk_scale,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // REP
    g = tl.load(TILES + 2 * tile)
    s0 = tl.load(TILES + 2 * tile + 1)
    is_node = g >= 0
    gg = tl.maximum(g, 0).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    slots = s0 + offs_m
    size = tl.load(GROUP_SIZE + gg, mask=is_node, other=0)
    anchor = tl.load(GROUP_ANCHOR + gg, mask=is_node, other=0)
    row_ok = tl.where(is_node, slots < size, slots < P)
    node = tl.load(GROUP_NODES + gg * M + slots, mask=is_node & row_ok, other=0)
    qrow = tl.where(is_node, QBASE + node, slots).to(tl.int64)
    vis = tl.where(is_node, anchor + 1, slots + 1)  # visible prefix columns per row
    n_pref = tl.where(is_node, anchor + 1, tl.minimum(s0 + BLOCK_M, P))
    n_tree = tl.where(is_node, tl.minimum(s0 + BLOCK_M, size), 0)
    q_ok = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + qrow[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=q_ok, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    # 1. prefix keys: column 0 is visible to every row, so m_i is finite after the first tile (no NaN later)
    for start in range(0, n_pref, BLOCK_N):
        cols = (start + offs_n).to(tl.int64)
        c_ok = cols < n_pref
        k = tl.load(KP + cols[None, :] * stride_kpt + kvh * stride_kph + offs_d[:, None],
                    mask=c_ok[None, :] & d_ok[:, None], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        s = tl.where((cols[None, :] < vis[:, None]) & c_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        vv = tl.load(VP + cols[:, None] * stride_vpt + kvh * stride_vph + offs_d[None, :],
                     mask=c_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            vv = vv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv, input_precision=PRECISION)
        m_i = m_new
    # 2. the tree's own nodes (tree tiles only): ancestors-or-self from the packed [G, M, M] matrix
    for start in range(0, n_tree, BLOCK_N):
        ks = start + offs_n
        k_ok = ks < n_tree
        knode = tl.load(GROUP_NODES + gg * M + ks, mask=k_ok, other=0).to(tl.int64)
        k = tl.load(KN + knode[None, :] * stride_knt + kvh * stride_knh + offs_d[:, None],
                    mask=k_ok[None, :] & d_ok[:, None], other=0.0)
        anc = tl.load(GROUP_ANC + (gg * M + slots[:, None]) * M + ks[None, :],
                      mask=row_ok[:, None] & k_ok[None, :], other=0)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        s = tl.where(anc != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        vv = tl.load(VN + knode[:, None] * stride_vnt + kvh * stride_vnh + offs_d[None, :],
                     mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            vv = vv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + qrow[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty), mask=q_ok)


_KERNELS: dict = {}


def triton_available() -> bool:
    """True if triton imports (the kernel still needs CUDA tensors or TRITON_INTERPRET=1)."""
    return triton is not None


def triton_runs_on(device) -> bool:
    """True if :func:`tree_attention_triton` can run on ``device``: CUDA with triton, or any device under
    TRITON_INTERPRET=1 (CPU tests)."""
    dev = torch.device(device)
    return triton is not None and (dev.type == "cuda" or (dev.type == "cpu" and interpret()))


def check_triton_call(name: str, tensors: Tuple[torch.Tensor, ...], grad_path: str) -> None:
    """Checks shared by the forward-only attention kernels; ``tensors[0]`` is q (its device and dtype rule).

    Raises RuntimeError for CPU tensors without TRITON_INTERPRET=1; TypeError on a dtype other than fp32 / bf16 /
    fp16; ValueError when an input requires grad with autograd on (``grad_path`` names the differentiable path)."""
    q = tensors[0]
    if not triton_runs_on(q.device):
        raise RuntimeError(f"{name} got CPU tensors: set TRITON_INTERPRET=1 (tests) or use CUDA")
    if q.dtype not in _DTYPES:
        raise TypeError(f"{name} supports fp32/bf16/fp16, got {q.dtype}")
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        raise ValueError(f"{name} is forward only: call it under torch.no_grad() or use {grad_path} to differentiate")


def _kernel():
    return lazy_jit(_KERNELS, (_tree_attn_fwd_kernel,), triton is not None,
                    "specopd_kernels.tree.triton_attention needs triton (pip install triton); use "
                    "tree_attention_grouped instead")[0]


def _blocks(layout: TreeLayout) -> Tuple[int, int, int]:
    """(BLOCK_M of prefix tiles, BLOCK_M of tree tiles, BLOCK_N): tree tiles never mix trees, so their
    BLOCK_M follows the largest tree (16..64 rows). The interpreter gets larger tiles (fewer numpy steps)."""
    big = 128 if interpret() else 64
    return big, min(64, max(16, triton.next_power_of_2(max(layout.group_sizes, default=1)))), big


def _tables(layout: TreeLayout, block_p: int, block_t: int, with_prefix: bool, device) -> Tuple[torch.Tensor, ...]:
    """(prefix tiles int32 [n, 2] = (-1, first row), tree tiles int32 [n, 2] = (tree, first slot), group_size
    int32 [G], group_anc int8 [G, M, M], group_nodes int64, group_anchor int64) on ``device``, cached on the
    layout."""
    key = ("triton", block_p, block_t, with_prefix, str(device))
    hit = layout.cache.get(key)
    if hit is None:
        pre = [(-1, s) for s in range(0, layout.prefix_len, block_p)] if with_prefix else []
        tree = [(g, s) for g, size in enumerate(layout.group_sizes) for s in range(0, size, block_t)]
        one = torch.zeros(1, dtype=torch.int64, device=device)  # stand-in pointer when there is no tree
        has = bool(layout.group_sizes)
        hit = (torch.tensor(pre, dtype=torch.int32).reshape(-1, 2).to(device),
               torch.tensor(tree, dtype=torch.int32).reshape(-1, 2).to(device),
               torch.tensor(layout.group_sizes or (0,), dtype=torch.int32).to(device),
               layout.group_anc.to(device, torch.int8).contiguous() if has else one.to(torch.int8),
               layout.group_nodes.to(device).contiguous() if has else one,
               layout.group_anchor.to(device).contiguous() if has else one)
        layout.cache[key] = hit
    return hit


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def tree_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout,
                          scale: Optional[float] = None,
                          prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Tree-mask attention with GQA over one packed row, one fused Triton kernel (forward only).

    Shapes and ``prefix_kv`` exactly as :func:`specopd_kernels.tree.tree_attention_grouped`: q [T, Hq, D],
    k, v [T, Hkv, D] (T = P + N, or N with ``prefix_kv = ([P, Hkv, D], [P, Hkv, D])``). dtype fp32 / bf16 /
    fp16 (k, v, prefix K/V are cast to q's dtype; fp32 dots in IEEE precision, softmax statistics and the
    accumulator in fp32); any head dim (padded to a power of two in registers; 64 / 128 are the tested ones).
    Returns [T, Hq, D] in q's dtype. Layout requirement: tree g's nodes fill its first ``group_sizes[g]``
    slots (as :func:`build_tree_layout` makes them).
    Raises RuntimeError without triton or for CPU tensors without TRITON_INTERPRET=1; TypeError on other
    dtypes; ValueError on shape mismatch (as the grouped path) or when an input requires grad with autograd
    enabled (no backward: use the grouped path to differentiate).
    UNVERIFIED on a GPU (interpreter-tested; see ``benchmarks/kernels_gpu/run.py``).
    """
    rep, base = check_tree_row(q, k, v, layout, prefix_kv)
    kernel = _kernel()
    check_triton_call("tree_attention_triton", (q, k, v) + (tuple(prefix_kv) if prefix_kv is not None else ()),
                      "tree_attention_grouped")
    t, hq, d = q.shape
    p, dt = layout.prefix_len, q.dtype
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    q, k, v = _rows(q), _rows(k.to(dt)), _rows(v.to(dt))
    kp, vp = (_rows(x.to(dt)) for x in prefix_kv) if prefix_kv is not None else (k[:p], v[:p])
    kn, vn = k[base:], v[base:]
    out = torch.empty(t, hq, d, dtype=dt, device=q.device)
    block_p, block_t, block_n = _blocks(layout)
    pre, tree, sizes, anc, nodes, anchors = _tables(layout, block_p, block_t, prefix_kv is None, q.device)
    for tiles, block_m in ((pre, block_p), (tree, block_t)):
        if tiles.shape[0] == 0:
            continue
        kernel[(tiles.shape[0], hq)](
            q, kp, vp, kn, vn, out, tiles, nodes, anchors, sizes, anc,
            q.stride(0), q.stride(1), kp.stride(0), kp.stride(1), vp.stride(0), vp.stride(1),
            kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1), out.stride(0), out.stride(1),
            p, layout.group_nodes.shape[1], base, rep, d, scale * math.log2(math.e),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
            PRECISION="ieee" if dt == torch.float32 else "tf32", DOT_F32=dt == torch.bfloat16 and interpret(),
            num_warps=8 if d > 64 and block_m == 64 else 4)
    return out
