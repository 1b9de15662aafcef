"""Tree attention by anchor groups: the exact tree-mask attention without the dense [T, T] score matrix.

A packed row ``[prefix (P) | nodes of tree 0 | nodes of tree 1 | ...]`` has a very sparse tree mask: prefix rows
are causal; a node of the tree at anchor a sees prefix columns 0..a and its ancestors-or-self, all of which lie
inside its own tree. So instead of ``softmax(QK^T + mask)`` over T = P + N columns for every row (O(T^2) with
T ~ thousands of nodes), compute
  - prefix rows: causal attention over the prefix, O(P^2);
  - node rows, grouped by tree (G trees padded to M nodes) as a batch of G small attentions: the tree's M
    queries against [prefix (P) | the tree's own nodes (M)] keys, allowed = prefix columns <= the tree's anchor
    and ancestor-or-self nodes (one fused SDPA call with a [G, M, P+M] mask),
so the cost is O(P^2 + N P + sum_g n_g^2). Values equal :func:`tree_attention_reference` with
:func:`build_tree_mask` (see tests). Plain torch: the CPU path of ``/specopd/score_trees`` and a readable
reference layout for a GPU kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from .naive import as_index_tensor, tree_ancestors, validate_parents

__all__ = ["TreeLayout", "build_tree_layout", "tree_attention_grouped"]


@dataclass(frozen=True)
class TreeLayout:
    """Index form of one packed row's tree mask.

    prefix_len: P. group_nodes: int64 [G, M], packed node index (0-based among nodes) of slot m of tree g,
    padded with 0. group_valid: bool [G, M]. group_anchor: int64 [G], the tree's anchor position (< P).
    group_anc: bool [G, M, M], ancestor-or-self inside the tree (False on padding).
    """

    prefix_len: int
    group_nodes: torch.Tensor
    group_valid: torch.Tensor
    group_anchor: torch.Tensor
    group_anc: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.group_valid.sum())

    def to(self, device) -> "TreeLayout":
        return TreeLayout(self.prefix_len, self.group_nodes.to(device), self.group_valid.to(device),
                          self.group_anchor.to(device), self.group_anc.to(device))


def build_tree_layout(prefix_len: int, anchors: Sequence[int], tree_parents: Sequence[Sequence[int]]) -> TreeLayout:
    """Layout of ``len(anchors)`` trees packed in order after a ``prefix_len``-token prefix.

    anchors: G ints in [0, prefix_len). tree_parents: per tree its parent array (-1 = child of the anchor,
    else an earlier node of the same tree). Raises ValueError on out-of-range anchors or bad parents.
    """
    if len(anchors) != len(tree_parents):
        raise ValueError(f"{len(anchors)} anchors but {len(tree_parents)} trees")
    g = len(anchors)
    m = max((len(p) for p in tree_parents), default=0)
    nodes = torch.zeros(g, m, dtype=torch.int64)
    valid = torch.zeros(g, m, dtype=torch.bool)
    anc = torch.zeros(g, m, m, dtype=torch.bool)
    offset = 0
    for i, (a, parents) in enumerate(zip(anchors, tree_parents)):
        if not 0 <= int(a) < prefix_len:
            raise ValueError(f"anchor {a} out of range [0, {prefix_len})")
        par = as_index_tensor(parents, f"tree_parents[{i}]")
        validate_parents(par, f"tree_parents[{i}]")
        n = par.numel()
        nodes[i, :n] = torch.arange(offset, offset + n)
        valid[i, :n] = True
        if n:
            anc[i, :n, :n] = tree_ancestors(par)[0]
        offset += n
    return TreeLayout(prefix_len, nodes, valid, as_index_tensor(list(anchors), "anchors"), anc)


def tree_attention_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout,
                           scale: Optional[float] = None,
                           prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Tree-mask attention with GQA over one packed row, by anchor groups.

    q: [T, Hq, D]; k, v: [T, Hkv, D] (T = P + N, Hq a multiple of Hkv, HF ``repeat_kv`` head mapping: query
    head h uses kv head h // (Hq / Hkv)). Attention runs in q's dtype through
    ``scaled_dot_product_attention`` (fused kernels, fp32 accumulation). Returns [T, Hq, D] in q's dtype.
    With ``prefix_kv = (k_prefix, v_prefix)`` (``[P, Hkv, D]`` each, the prefix's keys and values as an earlier
    forward computed them) q, k, v hold the N node rows only (T = N) and the result is the nodes' [N, Hq, D]:
    the same node outputs, without recomputing the prefix. Differentiable (plain torch).
    Raises ValueError if T does not match the layout or Hq is not a multiple of Hkv.
    """
    t, hq, d = q.shape
    hkv = k.shape[1]
    p = layout.prefix_len
    n = layout.num_nodes
    cached = prefix_kv is not None
    if t != (0 if cached else p) + n or k.shape[0] != t or v.shape[0] != t:
        raise ValueError(f"row has {t} tokens, layout expects {0 if cached else p} + {n}"
                         + (" (prefix K/V given: node rows only)" if cached else ""))
    if cached and (prefix_kv[0].shape[0] != p or prefix_kv[1].shape[0] != p):
        raise ValueError(f"prefix K/V have {prefix_kv[0].shape[0]} / {prefix_kv[1].shape[0]} rows, layout "
                         f"expects {p}")
    if hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rep = hq // hkv
    dt = q.dtype
    k, v = k.to(dt), v.to(dt)
    out = torch.empty(t, hq, d, dtype=dt, device=q.device)
    if cached:
        kp, vp, base = prefix_kv[0].to(dt), prefix_kv[1].to(dt), 0
    else:
        kp, vp, base = k[:p], v[:p], p
        out[:p] = torch.nn.functional.scaled_dot_product_attention(
            q[:p].transpose(0, 1), kp.transpose(0, 1), vp.transpose(0, 1), is_causal=True, scale=scale,
            enable_gqa=rep > 1).transpose(0, 1)
    if n:
        g, m = layout.group_nodes.shape
        rows = base + layout.group_nodes.reshape(-1)  # [G*M]
        qn = q[rows].view(g, m, hq, d).transpose(1, 2)  # [G, Hq, M, D]
        keys = torch.cat([kp.transpose(0, 1)[None].expand(g, hkv, p, d),
                          k[rows].view(g, m, hkv, d).transpose(1, 2)], dim=2)  # [G, Hkv, P+M, D]
        vals = torch.cat([vp.transpose(0, 1)[None].expand(g, hkv, p, d),
                          v[rows].view(g, m, hkv, d).transpose(1, 2)], dim=2)
        allowed = torch.cat([(torch.arange(p, device=q.device)[None, :] <= layout.group_anchor[:, None])
                             [:, None, :].expand(g, m, p), layout.group_anc], dim=-1)  # [G, M, P+M]
        allowed = allowed | ~layout.group_valid[:, :, None]  # padding rows: anything (discarded), avoids NaN
        o = torch.nn.functional.scaled_dot_product_attention(qn, keys, vals, attn_mask=allowed[:, None], scale=scale,
                                                             enable_gqa=rep > 1)  # [G, Hq, M, D]
        o = o.transpose(1, 2).reshape(g * m, hq, d)
        keep = layout.group_valid.reshape(-1)
        out[rows[keep]] = o[keep]
    return out
