"""QSA sparse attention over a packed proposal-tree row: the torch path, the backend choice and the whole layer
step (selection + attention, :func:`qsa_tree_attention`).

Backends of the attention over a selection, all with the signature of :func:`sparse_attention_torch`
``(q, k, v, indices, scale=None, prefix_kv=None) -> out``:
  - ``torch``: :func:`sparse_attention_torch`, gathers each row chunk's keys, exact, differentiable, any device.
    The default on CPU, and on CUDA unless the kernel below is verified there.
  - ``triton``: :func:`specopd_kernels.sparse.triton_sparse.sparse_attention_triton`, forward only. The default on
    CUDA only once the GPU acceptance run (``benchmarks/kernels_gpu/run.py``) verified it for its current source
    (:mod:`specopd_kernels.verified`).
``SPECOPD_SPARSE_ATTENTION`` = ``torch`` / ``triton`` / ``verified`` (or ``SPECOPD_KERNELS``, CUDA only) overrides
the choice.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch

from ..verified import choose
from ..tree.layout import TreeLayout
from ..tree.triton_attention import triton_runs_on
from .indexer import QSAConfig
from .select import QSASelection, qsa_tree_select
from .triton_sparse import check_sparse_inputs, sparse_attention_triton

__all__ = ["SPARSE_ATTENTION_BACKENDS", "get_sparse_attention", "qsa_tree_attention", "sparse_attention_backend_name",
           "sparse_attention_torch"]

ENV_VAR = "SPECOPD_SPARSE_ATTENTION"
_CHUNK_BYTES = 128 << 20  # fp32 gathered K + V per row chunk


def sparse_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                           scale: Optional[float] = None,
                           prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Each query row's softmax attention over its own selected key rows, GQA, plain torch (differentiable).

    Contract of :func:`specopd_kernels.sparse.triton_sparse.sparse_attention_triton`: q [R, Hq, D]; k, v
    [S, Hkv, D]; indices int [R, W], -1 = none; with ``prefix_kv = (kp, vp)`` [P, Hkv, D] an index i < P is prefix
    row i and i >= P is row i - P of k / v. fp32 math over row chunks (gathered K/V of a chunk <= 128 MiB).
    Returns [R, Hq, D] in q's dtype, zeros for a row with no key. Raises ValueError on bad shapes / indices."""
    check_sparse_inputs(q, k, v, indices, prefix_kv)
    r, hq, d = q.shape
    hkv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if prefix_kv is not None:
        k, v = torch.cat([prefix_kv[0].to(k.dtype), k]), torch.cat([prefix_kv[1].to(v.dtype), v])
    indices = indices.to(q.device, torch.int64)
    step = max(1, _CHUNK_BYTES // max(1, 8 * indices.shape[1] * hkv * d))
    outs = []
    for s in range(0, r, step):
        idx = indices[s:s + step]
        ok = idx >= 0
        kk = k[idx.clamp(min=0)].float()  # [c, W, Hkv, D]
        vv = v[idx.clamp(min=0)].float()
        qq = q[s:s + step].float().reshape(-1, hkv, hq // hkv, d)
        att = torch.einsum("cgrd,cwgd->cgrw", qq, kk) * scale
        att = torch.softmax(att.masked_fill(~ok[:, None, None, :], float("-inf")), -1)
        att = att.masked_fill(~ok.any(1)[:, None, None, None], 0.0)  # no key: zeros, not NaN
        outs.append(torch.einsum("cgrw,cwgd->cgrd", att, vv).reshape(-1, hq, d))
    return (torch.cat(outs) if outs else q.new_zeros(0, hq, d, dtype=torch.float32)).to(q.dtype)


SPARSE_ATTENTION_BACKENDS: Dict[str, Tuple[Callable, Callable[[torch.device], bool]]] = {
    "torch": (sparse_attention_torch, lambda device: True),
    "triton": (sparse_attention_triton, triton_runs_on),
}


def sparse_attention_backend_name(device, name: Optional[str] = None) -> str:
    """The backend :func:`get_sparse_attention` picks for ``device`` (:func:`specopd_kernels.verified.choose` for
    op ``sparse_attention``): ``name`` if given, else ``SPECOPD_SPARSE_ATTENTION``, else (CUDA)
    ``SPECOPD_KERNELS``, else ``triton`` on CUDA when the GPU acceptance run verified it, else ``torch``.
    Raises ValueError on an unknown name or a backend that cannot run on ``device``."""
    return choose("sparse_attention", device, {k: b[1] for k, b in SPARSE_ATTENTION_BACKENDS.items()},
                  name=name).backend


def get_sparse_attention(device, name: Optional[str] = None) -> Callable:
    """The sparse-attention function for tensors on ``device`` (see :func:`sparse_attention_backend_name`): a
    callable with the contract of :func:`sparse_attention_torch`. Raises ValueError on an unusable name."""
    return SPARSE_ATTENTION_BACKENDS[sparse_attention_backend_name(device, name)][0]


def qsa_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index_q: torch.Tensor,
                       index_k: torch.Tensor, layout: TreeLayout, cfg: QSAConfig, scale: Optional[float] = None,
                       prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                       prefix_index_k: Optional[torch.Tensor] = None,
                       backend: Optional[str] = None) -> Tuple[torch.Tensor, QSASelection]:
    """One QSA sparse-attention layer over a packed proposal-tree row: every row's selection exactly as sequential
    decoding of its branch makes it (:func:`qsa_tree_select`), then the attention over it (backend per device).

    Full row: q [P+N, Hq, D], k, v [P+N, Hkv, D], index_q [P+N, Hi, Di], index_k [P+N, Di] (or [P+N, 1, Di]).
    Cached prefix: the same for the N node rows only, with ``prefix_kv = ([P, Hkv, D], [P, Hkv, D])`` and
    ``prefix_index_k`` [P, Di]. q / k / v: the layer's attention inputs after RoPE; index_q after q_layernorm + RoPE;
    index_k raw. Returns (out [rows, Hq, D] in q's dtype, before the layer's output gate; the selection).
    backend: ``torch`` / ``triton`` / None (see :func:`sparse_attention_backend_name`).
    Raises ValueError on row counts that do not match the layout, a cached call without ``prefix_index_k``, or an
    unusable backend; the backend's own errors (e.g. Triton with grad)."""
    p = layout.prefix_len
    if prefix_kv is not None:
        if prefix_index_k is None:
            raise ValueError("a cached-prefix call (prefix_kv) needs prefix_index_k, the prefix's raw index keys")
        ik_prefix, ik_nodes = prefix_index_k, index_k
    else:
        if q.shape[0] != p + layout.num_nodes:
            raise ValueError(f"row has {q.shape[0]} tokens, layout expects {p} + {layout.num_nodes}")
        ik_prefix, ik_nodes = index_k[:p], index_k[p:]
    if q.shape[0] != index_q.shape[0]:
        raise ValueError(f"{q.shape[0]} query rows but {index_q.shape[0]} index queries")
    sel = qsa_tree_select(index_q, ik_prefix, ik_nodes, layout, cfg)
    fn = get_sparse_attention(q.device, backend)
    return fn(q, k, v, sel.indices, scale, prefix_kv), sel
