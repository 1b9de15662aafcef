"""Sparse (gathered-key) attention as one Triton kernel, forward only: the GPU path of QSA tree scoring.

Each query row attends to its own list of key rows (:class:`specopd_kernels.sparse.select.QSASelection`
``indices``): the grid is (rows, Hkv); a program loads the Hq / Hkv query heads of one kv head as one
[BLOCK_H, D] tile (so each gathered key tile is loaded once per kv head, not once per query head), then streams
the row's selected keys in tiles of BLOCK_N with an online softmax (exp2, fp32 statistics and accumulator). Key
rows come from two sources without a copy: index ``i < P`` reads the prefix K/V row i, ``i >= P`` the node K/V row
``i - P`` (with no separate prefix, both sources are the same tensor and every index is < P). A row's valid
indices must come first (the wrapper compacts them if not); the loop stops at the row's count, and a row with no
key gives zeros (as SGLang's ``qsa_sparse_attention_reference``).

Only the attention is a kernel: the indexer logits and the top-k are torch (:mod:`.select`). Kernels are jitted
lazily per TRITON_INTERPRET value (:mod:`specopd_kernels.lazy_triton`); under the interpreter bf16 tiles are
upcast to fp32 before the dots (the interpreter's bf16 ``tl.dot`` is wrong in triton 3.8), compiled kernels dot
in bf16. UNVERIFIED ON A GPU until ``benchmarks/kernels_gpu/run.py`` runs on one (its ``sparse_attention`` case).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ..lazy_triton import interpret, lazy_jit
from ..tree import triton_attention as _tree_triton
from ..tree.triton_attention import check_triton_call, tl  # tl is None where triton does not import

__all__ = ["check_sparse_inputs", "compact_indices", "sparse_attention_triton"]


def _sparse_attn_fwd_kernel(Q, KP, VP, KN, VN, O, IDX, CNT,
                            stride_qt, stride_qh, stride_kpt, stride_kph, stride_vpt, stride_vph,
                            stride_knt, stride_knh, stride_vnt, stride_vnh, stride_ot, stride_oh, stride_it,
                            P, REP, HEAD_DIM, qk_scale,
                            BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                            PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < REP
    d_ok = offs_d < HEAD_DIM
    heads = kvh * REP + offs_h
    qo_ok = h_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=qo_ok, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    cnt = tl.load(CNT + row)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_H], 0.0, tl.float32)
    acc = tl.full([BLOCK_H, BLOCK_D], 0.0, tl.float32)
    # valid indices come first, so every tile has one: m_i is finite after the first tile (no NaN)
    for start in range(0, cnt, BLOCK_N):
        cols = start + offs_n
        idx = tl.load(IDX + row * stride_it + cols, mask=cols < cnt, other=-1).to(tl.int64)
        in_p = (idx >= 0) & (idx < P)
        in_n = idx >= P
        ip = tl.where(in_p, idx, 0)
        inn = tl.where(in_n, idx - P, 0)
        k = tl.load(KP + ip[None, :] * stride_kpt + kvh * stride_kph + offs_d[:, None],
                    mask=in_p[None, :] & d_ok[:, None], other=0.0)
        k = k + tl.load(KN + inn[None, :] * stride_knt + kvh * stride_knh + offs_d[:, None],
                        mask=in_n[None, :] & d_ok[:, None], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        s = tl.where((in_p | in_n)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        vv = tl.load(VP + ip[:, None] * stride_vpt + kvh * stride_vph + offs_d[None, :],
                     mask=in_p[:, None] & d_ok[None, :], other=0.0)
        vv = vv + tl.load(VN + inn[:, None] * stride_vnt + kvh * stride_vnh + offs_d[None, :],
                          mask=in_n[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            vv = vv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=qo_ok)


_KERNELS: dict = {}


def _kernel():
    return lazy_jit(_KERNELS, (_sparse_attn_fwd_kernel,), _tree_triton.triton is not None,
                    "specopd_kernels.sparse.triton_sparse needs triton (pip install triton); use "
                    "sparse_attention_torch instead")[0]


def _pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def compact_indices(indices: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(indices with each row's valid (>= 0) entries first, order kept, int64 [R, W]; counts int64 [R]).

    Returns the input itself when it is already compact (:func:`qsa_tree_select` output is)."""
    valid = indices >= 0
    counts = valid.sum(1)
    if bool((valid == (torch.arange(indices.shape[1], device=indices.device) < counts[:, None])).all()):
        return indices, counts
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
    return indices.gather(1, order), counts


def check_sparse_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                        prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Validate one sparse-attention call; returns the number of key rows (prefix rows + k rows).

    Raises ValueError on shape mismatch, Hq not a multiple of Hkv, or an index >= the key rows."""
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or k.shape[2] != q.shape[2]:
        raise ValueError(f"q must be [R, Hq, D] and k, v [S, Hkv, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"Hq={q.shape[1]} must be a multiple of Hkv={k.shape[1]}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"indices must be [R={q.shape[0]}, W], got {tuple(indices.shape)}")
    total = k.shape[0]
    if prefix_kv is not None:
        if prefix_kv[0].shape != prefix_kv[1].shape or prefix_kv[0].shape[1:] != k.shape[1:]:
            raise ValueError(f"prefix K/V {tuple(prefix_kv[0].shape)} / {tuple(prefix_kv[1].shape)} do not match "
                             f"k {tuple(k.shape)}")
        total += prefix_kv[0].shape[0]
    if indices.numel() and int(indices.max()) >= total:
        raise ValueError(f"index {int(indices.max())} out of range: {total} key rows")
    return total


def sparse_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                            scale: Optional[float] = None,
                            prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Each query row's softmax attention over its own selected key rows, GQA, one Triton kernel (forward only).

    q: [R, Hq, D]; k, v: [S, Hkv, D] (Hq a multiple of Hkv: head h uses kv head h // (Hq / Hkv)); indices: int
    [R, W], key rows per query, -1 = none (any order). Without ``prefix_kv`` an index i is row i of k / v; with
    ``prefix_kv = (kp, vp)`` [P, Hkv, D], i < P is prefix row i and i >= P is row i - P of k / v (the layout of
    :class:`QSASelection.indices` for node rows scored against a cached prefix). dtype fp32 / bf16 / fp16 (K/V cast
    to q's dtype; fp32 dots in IEEE precision; softmax statistics and accumulator fp32). Returns [R, Hq, D] in q's
    dtype, zeros for a row with no key. Formula: SGLang ``qsa_sparse_attention_reference`` (qsa/kernel.py).
    Raises RuntimeError without triton or for CPU tensors without TRITON_INTERPRET=1; TypeError on other dtypes;
    ValueError on bad shapes / indices, or when an input requires grad with autograd on (no backward: use
    :func:`specopd_kernels.sparse.sparse_attention_torch` to differentiate). UNVERIFIED on a GPU.
    """
    check_sparse_inputs(q, k, v, indices, prefix_kv)
    kernel = _kernel()
    check_triton_call("sparse_attention_triton", (q, k, v) + (tuple(prefix_kv) if prefix_kv is not None else ()),
                      "sparse_attention_torch")
    r, hq, d = q.shape
    hkv, dt = k.shape[1], q.dtype
    out = torch.empty(r, hq, d, dtype=dt, device=q.device)
    if r == 0:
        return out
    idx, counts = compact_indices(indices.to(q.device, torch.int64))
    idx, counts = idx.to(torch.int32).contiguous(), counts.to(torch.int32).contiguous()
    q, k, v = (x.to(dt).contiguous() for x in (q, k, v))
    if prefix_kv is not None:
        kp, vp = (x.to(dt).contiguous() for x in prefix_kv)
        p = kp.shape[0]
    else:
        kp, vp, p = k, v, k.shape[0]
    rep = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kernel[(r, hkv)](
        q, kp, vp, k, v, out, idx, counts,
        q.stride(0), q.stride(1), kp.stride(0), kp.stride(1), vp.stride(0), vp.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1), idx.stride(0),
        p, rep, d, scale * math.log2(math.e),
        BLOCK_H=max(16, _pow2(rep)), BLOCK_N=64, BLOCK_D=max(16, _pow2(d)),
        PRECISION="ieee" if dt == torch.float32 else "tf32", DOT_F32=dt == torch.bfloat16 and interpret(),
        num_warps=4)
    return out
