"""Tree attention through FlashInfer's packed custom mask (``flashinfer.single_prefill_with_kv_cache``).

The ``flashinfer`` entry of the tree-attention registry (:mod:`specopd_kernels.tree.backends`): one packed row
``[prefix (P) | nodes (N)]`` is scored by FlashInfer's prefill kernel with an explicit ``[Q, KV]`` mask, bit-packed
as FlashInfer packs it (``flashinfer.quantization.packbits``, bit order "little": element 8j+i is bit i of byte j;
:func:`specopd_kernels.tree.packbits`). The mask is the proposal-tree mask of
:func:`specopd_kernels.tree.naive.ProposalTree.mask`: causal over the prefix; node i sees the prefix up to and
including its anchor, and itself and its ancestors among the nodes. With ``prefix_kv`` (the prefix's K/V from the
score_trees prefix cache) the queries are the N nodes only and the keys are ``[prefix K/V | node K/V]``.

The mask is built once per layout and device and kept in ``layout.cache`` (every layer of a forward shares it):
``ceil(Q * (P + N) / 8)`` bytes, e.g. 248 KB for 16 anchors x 8 branches x block 8 on a 512-token reference.

UNVERIFIED ON A GPU: FlashInfer runs on CUDA only; on this project's CPU machines the mask construction and the
call (arguments, shapes, the packed mask's bit order) are tested against the torch reference with FlashInfer's
function replaced by a torch stand-in (tests/test_tree_flashinfer.py). Pick it with
``SPECOPD_TREE_ATTENTION=flashinfer`` on a GPU machine with FlashInfer installed, after
``benchmarks/kernels_gpu/run.py`` has checked it there. Forward only.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .layout import TreeLayout, check_tree_row
from .packbits import packbits

__all__ = ["tree_row_mask", "tree_attention_flashinfer", "flashinfer_runs_on"]

_CACHE_KEY = "flashinfer_mask"


def tree_row_mask(layout: TreeLayout, with_prefix_rows: bool = True) -> torch.Tensor:
    """The attention mask of one packed row, bool ``[Q, P + N]`` (True = query may attend to key).

    Rows are the queries: the P prefix positions then the N nodes (``with_prefix_rows``), or the N nodes only.
    Columns are the keys ``[prefix | nodes]``. Prefix row i sees prefix keys 0..i; node n sees prefix keys
    0..anchor(n) and the nodes that are its ancestors or itself (``layout.group_anc``). On ``layout``'s device.
    """
    p, n = layout.prefix_len, layout.num_nodes
    dev = layout.group_nodes.device
    nodes = torch.zeros(n, p + n, dtype=torch.bool, device=dev)
    if n:
        nodes[:, :p] = torch.arange(p, device=dev)[None, :] <= layout.node_anchor[:, None]
        both = layout.group_valid[:, :, None] & layout.group_valid[:, None, :] & layout.group_anc  # [G, M, M]
        gi, qi, ki = both.nonzero(as_tuple=True)
        nodes[layout.group_nodes[gi, qi], p + layout.group_nodes[gi, ki]] = True
    if not with_prefix_rows:
        return nodes
    prefix = torch.zeros(p, p + n, dtype=torch.bool, device=dev)
    prefix[:, :p] = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
    return torch.cat([prefix, nodes])


def _packed_mask(layout: TreeLayout, with_prefix_rows: bool, device) -> torch.Tensor:
    key = (_CACHE_KEY, with_prefix_rows, str(device))
    if key not in layout.cache:
        mask = tree_row_mask(layout, with_prefix_rows).to(device)
        layout.cache[key] = packbits(mask.reshape(-1), bitorder="little")
    return layout.cache[key]


def flashinfer_runs_on(device) -> bool:
    """Whether the FlashInfer backend can run tensors of ``device`` here: CUDA with ``flashinfer`` importable."""
    if torch.device(device).type != "cuda":
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:  # not installed, or built for another CUDA / torch
        return False
    return True


def tree_attention_flashinfer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout,
                              scale: Optional[float] = None,
                              prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Tree attention of one packed row by FlashInfer's prefill kernel with a packed custom mask.

    Same contract as :func:`specopd_kernels.tree.tree_attention_grouped`: q [T, Hq, D], k, v [T, Hkv, D] (fp16 /
    bf16 on CUDA, NHD layout, Hq a multiple of Hkv: GQA as FlashInfer does it), T = P + N, or T = N with
    ``prefix_kv = (k_prefix, v_prefix)`` ``[P, Hkv, D]``; scale: softmax scale, default 1/sqrt(D). Returns
    [T, Hq, D] in q's dtype. Raises ValueError as :func:`check_tree_row` does; ImportError without flashinfer.
    """
    import flashinfer

    check_tree_row(q, k, v, layout, prefix_kv)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if prefix_kv is not None:
        k = torch.cat([prefix_kv[0].to(k.dtype), k])
        v = torch.cat([prefix_kv[1].to(v.dtype), v])
    packed = _packed_mask(layout, prefix_kv is None, q.device)
    return flashinfer.single_prefill_with_kv_cache(q.contiguous(), k.contiguous(), v.contiguous(),
                                                   packed_custom_mask=packed, sm_scale=scale, kv_layout="NHD")
