"""Tree attention by anchor groups: the exact tree-mask attention without the dense [T, T] score matrix and
without any per-anchor copy of the prefix K/V.

A packed row ``[prefix (P) | nodes of tree 0 | nodes of tree 1 | ...]`` has a very sparse tree mask: prefix rows
are causal; a node of the tree at anchor a sees prefix columns 0..a and its ancestors-or-self, all of which lie
inside its own tree. Flash-attention style, the node rows' softmax is split in two parts, each kept as
un-normalised output, row max and row sum (o, m, l), and merged exactly as a log-sum-exp merge:
``w = exp(m_part - max(m_p, m_t))``, ``o = (w_p o_p + w_t o_t) / (w_p l_p + w_t l_t)``:
  - prefix part: every node query against the ONE shared prefix K/V ([Hkv, P, D], GQA by folding the Hq / Hkv
    query heads of a kv head into the rows of one batched matmul), masked per query row to the visible
    prefix length ``anchor + 1``, in chunks of node rows that only read the keys up to the chunk's last anchor
    (a chunk = consecutive trees with close anchors; a single anchor needs no mask);
  - tree part: per tree (G trees padded to M slots) its queries against its own M nodes, ancestor-or-self mask.
Prefix rows are one causal ``scaled_dot_product_attention``. Cost O(P^2 + N P + sum_g n_g^2) like the dense
mask restricted to its non-zero blocks; values equal :func:`tree_attention_reference` with
:func:`build_tree_mask` (see tests). Plain torch: the CPU path of ``/specopd/score_trees`` and the reference
layout of the Triton kernel (:mod:`specopd_kernels.tree.triton_attention`).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

from .layout import TreeLayout, build_tree_layout, check_tree_row

__all__ = ["TreeLayout", "build_tree_layout", "tree_attention_grouped", "CHUNK_BYTES"]

# Score-tile budget: node rows (prefix part) / trees (tree part) are processed in chunks whose fp32 score
# matrix stays under this many bytes.
CHUNK_BYTES = 32 << 20


def _rows_per_chunk(bytes_per_row: int) -> int:
    return max(1, CHUNK_BYTES // max(1, bytes_per_row))


def _exp_scores(s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """In place: ``s <- exp(s - m)`` with m the (detached) row max; every row needs one finite entry.

    Returns (s, m [..., 1], l = sum of s [..., 1]). Detaching m is exact: the merged softmax does not depend
    on the shift, so its gradient through m is zero."""
    m = s.detach().amax(-1, keepdim=True)
    s = s.sub_(m).exp_()
    return s, m, s.sum(-1, keepdim=True)


def _prefix_chunks(layout: TreeLayout, row_bytes: int) -> List[Tuple[int, int, int, bool]]:
    """Host plan of the prefix part, cached on the layout: ``(i0, i1, vis, uniform)`` node-row ranges whose
    visible prefix ``vis`` (the range's largest anchor + 1) wastes at most ~25% of the score matrix on masked
    columns (consecutive trees with close anchors share a chunk; a range is split further only where its
    scores would exceed :data:`CHUNK_BYTES`), ``uniform`` when every row of the range has the same anchor (no
    mask needed).
    row_bytes: score bytes per node row and prefix column."""
    key = ("prefix_chunks", row_bytes)
    plan = layout.cache.get(key)
    if plan is None:
        plan = []
        anchors = layout.node_anchor.tolist()
        i0, vmax, vmin, useful = 0, 0, 0, 0
        for i, a in enumerate(anchors + [None]):
            if a is not None and i > i0:
                rows, vis = i - i0 + 1, max(vmax, a + 1)
                if rows * vis <= 1.25 * (useful + a + 1) and rows * vis * row_bytes <= CHUNK_BYTES:
                    vmax, vmin, useful = vis, min(vmin, a + 1), useful + a + 1
                    continue
            if i > i0:
                plan.append((i0, i, vmax, vmin == vmax))
            if a is not None:
                i0, vmax, vmin, useful = i, a + 1, a + 1, a + 1
        layout.cache[key] = plan
    return plan


def _prefix_part(qh: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, layout: TreeLayout):
    """qh: [Hkv, N, rep, D] scaled queries; kp, vp: [Hkv, P, D].

    Returns the un-normalised (o [Hkv, N, rep, D], m [Hkv, N, rep, 1], l [Hkv, N, rep, 1]) over each row's
    visible prefix columns 0..anchor."""
    hkv, n, rep, d = qh.shape
    cols = torch.arange(kp.shape[1], device=qh.device)
    parts = []
    for i0, i1, vis, uniform in _prefix_chunks(layout, hkv * rep * qh.element_size()):
        c = i1 - i0
        s = torch.bmm(qh[:, i0:i1].reshape(hkv, c * rep, d), kp[:, :vis].transpose(1, 2))
        if not uniform:
            hidden = cols[None, :vis] > layout.node_anchor[i0:i1, None]
            s.view(hkv, c, rep, vis).masked_fill_(hidden[:, None], float("-inf"))
        s, m, l = _exp_scores(s)
        parts.append((torch.bmm(s, vp[:, :vis]), m, l))
    return tuple(torch.cat([x[j] for x in parts], 1).view(hkv, n, rep, -1) for j in range(3))


def _dense(layout: TreeLayout) -> bool:
    """True when slot (g, m) holds node g * M + m for every slot (equal-sized trees packed in order): the tree
    part then needs no gathers."""
    flag = layout.cache.get("dense")
    if flag is None:
        flat = layout.group_nodes.reshape(-1)
        flag = bool(layout.group_valid.all()) and bool((flat == torch.arange(flat.numel(), device=flat.device)).all())
        layout.cache["dense"] = flag
    return flag


def _tree_part(qh: torch.Tensor, kn: torch.Tensor, vn: torch.Tensor, layout: TreeLayout):
    """qh: [Hkv, N, rep, D] scaled node queries; kn, vn: [Hkv, N, D].

    Returns the un-normalised (o [Hkv, N, rep, D], m, l [Hkv, N, rep, 1]) over each node's ancestors-or-self."""
    hkv, n, rep, d = qh.shape
    g, m = layout.group_nodes.shape
    allowed = layout.group_anc | ~layout.group_valid[:, :, None]  # padding rows: anything (discarded), no NaN
    step = _rows_per_chunk(hkv * rep * m * m * qh.element_size())
    dense = _dense(layout)
    parts = []
    for g0 in range(0, g, step):
        idx = layout.group_nodes[g0:g0 + step]
        c = idx.shape[0]
        if dense:
            qg, kg, vg = qh[:, g0 * m:(g0 + c) * m], kn[:, g0 * m:(g0 + c) * m], vn[:, g0 * m:(g0 + c) * m]
        else:
            idx = idx.reshape(-1)
            qg, kg, vg = qh[:, idx], kn[:, idx], vn[:, idx]
        s = torch.matmul(qg.reshape(hkv, c, m * rep, d), kg.reshape(hkv, c, m, d).transpose(-1, -2))
        s.view(hkv, c, m, rep, m).masked_fill_(~allowed[None, g0:g0 + c, :, None], float("-inf"))
        s, mx, l = _exp_scores(s)  # [Hkv, c, M*rep, M]
        parts.append((torch.matmul(s, vg.reshape(hkv, c, m, d)), mx, l))
    res = (torch.cat([x[j] for x in parts], 1).view(hkv, g * m, rep, -1) for j in range(3))
    return tuple(res) if dense else tuple(x[:, layout.node_slot] for x in res)


def tree_attention_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout,
                           scale: Optional[float] = None,
                           prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Tree-mask attention with GQA over one packed row, by anchor groups, sharing one prefix K/V.

    q: [T, Hq, D]; k, v: [T, Hkv, D] (T = P + N, Hq a multiple of Hkv, HF ``repeat_kv`` head mapping: query
    head h uses kv head h // (Hq / Hkv)). Prefix rows run in q's dtype through a causal
    ``scaled_dot_product_attention``; node rows in fp32 (fp64 for fp64 input). Returns [T, Hq, D] in q's dtype.
    With ``prefix_kv = (k_prefix, v_prefix)`` (``[P, Hkv, D]`` each, the prefix's keys and values as an earlier
    forward computed them) q, k, v hold the N node rows only (T = N) and the result is the nodes' [N, Hq, D]:
    the same node outputs, without recomputing the prefix. Differentiable (plain torch).

    Memory: the prefix K/V is never copied per anchor. Peak extra memory (no autograd) is the fp32 copies of the
    node rows and of the prefix K/V, O((P + N) Hkv D + N Hq D) (none for fp32 contiguous input besides the
    node-order outputs), plus one score chunk of at most :data:`CHUNK_BYTES` (x ~3: scores, probabilities,
    mask) for the prefix part and one for the tree part: it grows with N + P, not with anchors x P x heads x D.
    Measured (tests/test_tree_attention_grouped.py): 200 one-node anchors on a 2,000-token prefix, 9 / 3 heads
    of 64, cached prefix: +17 MB peak RSS, where the previous per-anchor copy took +0.58 GB.
    With autograd the saved probabilities add Hq N P_vis + Hq G M^2 fp32 values.
    Raises ValueError if T does not match the layout or Hq is not a multiple of Hkv.
    """
    rep, base = check_tree_row(q, k, v, layout, prefix_kv)
    t, hq, d = q.shape
    hkv, p, n = k.shape[1], layout.prefix_len, layout.num_nodes
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dt = q.dtype
    out = torch.empty(t, hq, d, dtype=dt, device=q.device)
    if prefix_kv is not None:
        kp, vp = prefix_kv
    else:
        kp, vp = k[:p], v[:p]
        out[:p] = torch.nn.functional.scaled_dot_product_attention(
            q[:p].transpose(0, 1), kp.to(dt).transpose(0, 1), vp.to(dt).transpose(0, 1), is_causal=True,
            scale=scale, enable_gqa=rep > 1).transpose(0, 1)
    if n:
        ct = torch.float64 if dt == torch.float64 else torch.float32
        qh = (q[base:].to(ct) * scale).reshape(n, hkv, rep, d).transpose(0, 1).contiguous()  # [Hkv, N, rep, D]
        kn, vn = (x[base:].to(ct).transpose(0, 1) for x in (k, v))  # [Hkv, N, D]
        kp, vp = (x.to(ct).transpose(0, 1) for x in (kp, vp))  # [Hkv, P, D], views when already ct
        o_p, m_p, l_p = _prefix_part(qh, kp, vp, layout)
        o_t, m_t, l_t = _tree_part(qh, kn, vn, layout)
        mx = torch.maximum(m_p, m_t)
        w_p, w_t = torch.exp(m_p - mx), torch.exp(m_t - mx)
        o = (w_p * o_p + w_t * o_t) / (w_p * l_p + w_t * l_t)  # [Hkv, N, rep, D]
        out[base:].view(n, hkv, rep, d).copy_(o.transpose(0, 1))
    return out
