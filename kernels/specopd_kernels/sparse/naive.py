"""Plain-torch references of QSA sparse attention (Qwen4-Exp sparse layers): one sequence token by token, and a
proposal tree node by node, each node scored as the last token of its own branch sequence.

A packed tree row is ``[prefix (P) | nodes of tree 0 | ...]`` (:class:`specopd_kernels.tree.TreeLayout`): a node of
the tree at anchor ``a`` at depth m (0 = child of the anchor) sits at position ``a + 1 + m`` of the branch sequence
``prefix[0..a] + its ancestors-or-self (root first)``, which is exactly what sequential decoding of that branch
sees. Selection rule and formulas: :mod:`specopd_kernels.sparse.indexer`. Slow (Python loops): tests only.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

from ..tree.layout import TreeLayout
from .indexer import QSAConfig, index_keys_2d, qsa_block_keys, qsa_logits

__all__ = ["node_paths", "qsa_select_last_naive", "qsa_select_sequence_naive", "qsa_sequence_naive",
           "qsa_tree_naive", "sparse_attention_naive"]


def qsa_select_last_naive(index_q_last: torch.Tensor, index_k_seq: torch.Tensor, cfg: QSAConfig) -> List[int]:
    """Positions the last token of a sequence attends to.

    index_q_last: [Hi, Di] the last token's index query; index_k_seq: [L, Di] raw index keys of the whole sequence
    (positions 0..L-1, the query at p = L - 1). Block keys are recomputed from the visible tokens; the top-k is a
    Python sort on (-logit, block). Returns the selected positions: blocks in selection order, each expanded to its
    r tokens, then the tail ``(p + 1) // r * r .. p``."""
    r, p = cfg.compress_ratio, index_k_seq.shape[0] - 1
    nb = (p + 1) // r
    blocks = list(range(nb))
    if nb > cfg.block_topk:
        keys = qsa_block_keys(index_k_seq[: nb * r].reshape(nb, r, index_k_seq.shape[1]), torch.arange(nb) * r, cfg)
        logits = qsa_logits(index_q_last[None], keys, cfg)[0].tolist()
        blocks = sorted(blocks, key=lambda b: (-logits[b], b))[: cfg.block_topk]
    return [b * r + o for b in blocks for o in range(r)] + list(range(nb * r, p + 1))


def _padded(rows: List[List[int]], width: int, device) -> torch.Tensor:
    out = torch.full((len(rows), width), -1, dtype=torch.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
    return out.to(device)


def qsa_select_sequence_naive(index_q: torch.Tensor, index_k: torch.Tensor, cfg: QSAConfig) -> torch.Tensor:
    """Selected positions of every token of one sequence, token by token (sequential decoding).

    index_q: [L, Hi, Di]; index_k: [L, Di] or [L, 1, Di]. Returns int64 [L, budget + r - 1] on index_q's device,
    -1 padded."""
    index_k = index_keys_2d(index_k)
    return _padded([qsa_select_last_naive(index_q[p], index_k[: p + 1], cfg) for p in range(index_q.shape[0])],
                   cfg.width, index_q.device)


def sparse_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                           scale: Optional[float] = None) -> torch.Tensor:
    """Softmax attention of each query row over its own key rows, GQA, fp32 math, one row at a time.

    q: [R, Hq, D]; k, v: [S, Hkv, D] (Hq a multiple of Hkv, head h uses kv head h // (Hq / Hkv)); indices: int
    [R, W] rows of k / v, -1 = none (any order; a row with none gives zeros). scale: default 1/sqrt(D).
    Returns [R, Hq, D] in q's dtype. SGLang ``qsa_sparse_attention_reference`` (qsa/kernel.py)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    rep = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i in range(q.shape[0]):
        rows = indices[i][indices[i] >= 0].long()
        if rows.numel():
            kk = k[rows].float().repeat_interleave(rep, 1)
            vv = v[rows].float().repeat_interleave(rep, 1)
            w = torch.softmax(torch.einsum("hd,khd->hk", q[i].float(), kk) * scale, -1)
            out[i] = torch.einsum("hk,khd->hd", w, vv)
    return out.to(q.dtype)


def qsa_sequence_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index_q: torch.Tensor,
                       index_k: torch.Tensor, cfg: QSAConfig,
                       scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sequence scored token by token: each token's selection, then sparse attention over it.

    q: [L, Hq, D]; k, v: [L, Hkv, D]; index_q: [L, Hi, Di]; index_k: [L, Di] or [L, 1, Di]. Returns (out [L, Hq, D]
    in q's dtype, selected positions int64 [L, budget + r - 1], -1 padded)."""
    pos = qsa_select_sequence_naive(index_q, index_k, cfg)
    return sparse_attention_naive(q, k, v, pos, scale), pos


def node_paths(layout: TreeLayout) -> List[Tuple[int, List[int]]]:
    """Per packed node: (anchor position, packed node indices of its ancestors-or-self, root first).

    Reads ``group_anc`` (ancestors sit in earlier slots of their tree, so slot order is depth order)."""
    paths: List[Tuple[int, List[int]]] = [(0, [])] * layout.num_nodes
    nodes, anc = layout.group_nodes.cpu(), layout.group_anc.cpu()
    for g, size in enumerate(layout.group_sizes):
        a = int(layout.group_anchor[g])
        for s in range(size):
            paths[int(nodes[g, s])] = (a, [int(nodes[g, t]) for t in range(s + 1) if anc[g, s, t]])
    return paths


def qsa_tree_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index_q: torch.Tensor, index_k: torch.Tensor,
                   layout: TreeLayout, cfg: QSAConfig,
                   scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A packed proposal-tree row scored row by row: prefix rows as one sequence, each node as the last token of its
    branch sequence ``prefix[0..anchor] + ancestors-or-self``.

    q: [P+N, Hq, D]; k, v: [P+N, Hkv, D]; index_q: [P+N, Hi, Di]; index_k: [P+N, Di] or [P+N, 1, Di], rows in
    layout order. Returns, on q's device, (out [P+N, Hq, D] in q's dtype; selected positions int64 [P+N, W]; the
    same selection as rows of the packed row int64 [P+N, W]: position x <= anchor -> prefix row x, else the
    ancestor at that depth -> P + node), W = budget + r - 1, -1 padded. Raises ValueError when T != P + N."""
    index_k = index_keys_2d(index_k)
    p, n = layout.prefix_len, layout.num_nodes
    if q.shape[0] != p + n or index_q.shape[0] != p + n or index_k.shape[0] != p + n:
        raise ValueError(f"row has {q.shape[0]} tokens ({index_q.shape[0]} index queries, {index_k.shape[0]} index "
                         f"keys), layout expects {p} + {n}")
    pos_rows, idx_rows = [], []
    for t in range(p):
        sel = qsa_select_last_naive(index_q[t], index_k[: t + 1], cfg)
        pos_rows.append(sel)
        idx_rows.append(sel)
    for node, (a, path) in enumerate(node_paths(layout)):
        seq = list(range(a + 1)) + [p + j for j in path]
        sel = qsa_select_last_naive(index_q[p + node], index_k[seq], cfg)
        pos_rows.append(sel)
        idx_rows.append([seq[x] for x in sel])
    idx = _padded(idx_rows, cfg.width, q.device)
    return sparse_attention_naive(q, k, v, idx, scale), _padded(pos_rows, cfg.width, q.device), idx
