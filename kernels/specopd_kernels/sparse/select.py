"""QSA key selection for a whole packed proposal-tree row at once (plain torch, vectorized over rows).

Each node of the tree at anchor ``a`` at depth m is the query at position ``p = a + 1 + m`` of its branch sequence
``prefix[0..a] + ancestors-or-self`` (:mod:`specopd_kernels.sparse.naive`); its visible compressed blocks are
  - the prefix blocks ``b < (a + 1) // r`` (keys computed once from the prefix, shared by every row), and
  - the blocks that reach past the anchor, ``(a + 1) // r <= b < (p + 1) // r``: block b is completed by the
    ancestor-or-self at position ``(b + 1) * r - 1``, so its key is computed once, at that completing node, from
    ``prefix[b*r..a]`` and the completing node's own path, and shared by all its descendants.
The selection is one per tree node, i.e. one per distinct root-to-node path: every branch through a node (the rows
that sequential decoding of each branch would score separately) shares it (the branch-consistent indexer group,
docs/sparse_attention.md). Rows that see at most ``block_topk`` blocks take every block and are not scored
(SGLang's ``fast_topk`` does the same); their selection in positions depends only on (anchor, depth).
The indexer logits and top-k run in torch (a sort per row chunk; a Triton top-k is not written): only the sparse
attention over the selection has a Triton kernel (:mod:`specopd_kernels.sparse.triton_sparse`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tree.layout import TreeLayout
from .indexer import QSAConfig, expand_blocks, index_keys_2d, qsa_block_keys, qsa_logits

__all__ = ["QSASelection", "qsa_tree_select", "selections_per_tree", "tree_paths"]

_CHUNK_BYTES = 64 << 20  # fp32 [rows, blocks, Hi] scoring workspace per chunk


@dataclass(frozen=True)
class QSASelection:
    """Selected keys of every query row of a packed row.

    positions: int64 [R, W], logical positions in each row's own branch sequence (valid entries first, -1 after);
    indices: int64 [R, W], the same keys as rows of ``[prefix (P) | nodes (N)]`` (prefix position x -> x, the
    ancestor at position x -> P + its packed node index); counts: int64 [R], valid entries per row; scored: bool
    [R], rows that saw more than block_topk blocks (indexer top-k ran; the others took every block); margin: fp32
    [R], the gap between the last selected block's indexer logit and the best unselected one's (``inf`` for rows
    that were not scored): a gap within float rounding means another implementation of the same logits (SGLang's)
    may select the other block.
    W = budget + r - 1; R = P + N (prefix rows first) or N (node rows only).
    """

    positions: torch.Tensor
    indices: torch.Tensor
    counts: torch.Tensor
    scored: torch.Tensor
    margin: torch.Tensor = None  # type: ignore[assignment]


def tree_paths(layout: TreeLayout, device=None) -> torch.Tensor:
    """Ancestors-or-self of every node by depth: int64 [N, Dmax], ``[n, m]`` = the packed index of n's ancestor at
    depth m (m = 0: child of the anchor; ``[n, depth(n)]`` = n), -1 past n's depth."""
    anc, nodes = layout.group_anc.to(device), layout.group_nodes.to(device)
    depth = anc.sum(-1) - 1  # [G, M], -1 on padding slots
    n = layout.num_nodes
    dmax = int(depth.max()) + 1 if n else 0
    path = torch.full((n, dmax), -1, dtype=torch.int64, device=anc.device)
    g, s, t = anc.nonzero(as_tuple=True)
    path[nodes[g, s], depth[g, t]] = nodes[g, t]
    return path


def _block_tables(kp: torch.Tensor, kn: torch.Tensor, anchor: torch.Tensor, path: torch.Tensor, p: int,
                  cfg: QSAConfig):
    """(prefix block keys [P // r, Di], keys of the blocks completed by tree nodes [Nc, Di], slot of each node's
    completed block int64 [N] or -1)."""
    r = cfg.compress_ratio
    nb_p = p // r
    pkeys = qsa_block_keys(kp[: nb_p * r].reshape(nb_p, r, kp.shape[1]), torch.arange(nb_p, device=kp.device) * r, cfg)
    n = kn.shape[0]
    depth = (path >= 0).sum(1) - 1
    pos = anchor + 1 + depth
    done = ((pos + 1) % r == 0).nonzero(as_tuple=True)[0]
    slot = torch.full((n,), -1, dtype=torch.int64, device=kp.device)
    slot[done] = torch.arange(done.numel(), device=kp.device)
    first = (pos[done] + 1 - r)
    x = first[:, None] + torch.arange(r, device=kp.device)  # member positions [Nc, r]
    a = anchor[done][:, None]
    member = torch.where(x <= a, x, p + path[done][:, None].expand(-1, r, -1).gather(
        2, (x - a - 1).clamp(min=0)[..., None])[..., 0])
    tkeys = qsa_block_keys(torch.cat([kp, kn])[member], first, cfg)
    return pkeys, tkeys, slot


def qsa_tree_select(index_q: torch.Tensor, index_k_prefix: torch.Tensor, index_k_nodes: torch.Tensor,
                    layout: TreeLayout, cfg: QSAConfig) -> QSASelection:
    """The QSA selection of every row of a packed tree row, exactly as sequential decoding of each branch makes it.

    index_q: [P+N, Hi, Di] (prefix rows then nodes) or [N, Hi, Di] (node rows only), each row's index query after
    q_layernorm + RoPE at its own position; index_k_prefix: [P, Di] / [P, 1, Di] and index_k_nodes: [N, Di] /
    [N, 1, Di], raw index keys. Any float dtype (logits in fp32). Returns :class:`QSASelection` on index_q's device.
    Ties between equal logits go to the lower block index. Raises ValueError on row counts that do not match
    the layout.
    """
    kp, kn = index_keys_2d(index_k_prefix, "index_k_prefix"), index_keys_2d(index_k_nodes, "index_k_nodes")
    p, n, dev = layout.prefix_len, layout.num_nodes, index_q.device
    if kp.shape[0] != p or kn.shape[0] != n or index_q.shape[0] not in (n, p + n):
        raise ValueError(f"index rows (q {index_q.shape[0]}, prefix k {kp.shape[0]}, node k {kn.shape[0]}) do not "
                         f"match the layout ({p} prefix + {n} nodes)")
    kp, kn = kp.to(dev), kn.to(dev)
    r, kb = cfg.compress_ratio, cfg.block_topk
    path = tree_paths(layout, dev)
    node_anchor = layout.node_anchor.to(dev)
    pkeys, tkeys, slot = _block_tables(kp, kn, node_anchor, path, p, cfg)
    with_prefix = index_q.shape[0] == p + n and p > 0
    if with_prefix:  # a prefix row t is a "node" at anchor t with an empty path
        path = torch.cat([torch.full((p, path.shape[1]), -1, dtype=torch.int64, device=dev), path])
        anchor = torch.cat([torch.arange(p, device=dev), node_anchor])
    else:
        anchor = node_anchor
    length = (path >= 0).sum(1)
    pos = anchor + length
    nb, npb = (pos + 1) // r, (anchor + 1) // r
    jmax = int((nb - npb).max()) if pos.numel() else 0
    blocks = torch.arange(kb, device=dev).expand(pos.shape[0], kb)
    blocks = torch.where(blocks < nb[:, None], blocks, -1).clone()
    scored = nb > kb
    margin = torch.full((pos.shape[0],), float("inf"), device=dev)
    rows_all = scored.nonzero(as_tuple=True)[0]
    per_row = index_q.shape[1] * (pkeys.shape[0] + jmax) * 4 + jmax * index_q.shape[2] * 4
    step = max(1, _CHUNK_BYTES // max(per_row, 1))
    for rows in rows_all.split(step) if rows_all.numel() else ():
        lp = qsa_logits(index_q[rows], pkeys, cfg)
        cols = torch.arange(pkeys.shape[0], device=dev)
        lp = lp.masked_fill(cols[None, :] >= npb[rows, None], float("-inf"))
        tb = npb[rows, None] + torch.arange(jmax, device=dev)  # tree block ids [c, Jmax]
        lt = lp.new_empty(rows.numel(), 0)
        if jmax:
            c_idx = ((tb + 1) * r - anchor[rows, None] - 2).clamp(0, path.shape[1] - 1)  # completing depth
            keys = slot[path[rows].gather(1, c_idx).clamp(min=0)].clamp(min=0)
            lt = qsa_logits(index_q[rows], tkeys[keys], cfg).masked_fill(tb >= nb[rows, None], float("-inf"))
        ids = torch.cat([cols.expand(rows.numel(), -1), tb], 1)
        ranked = torch.sort(torch.cat([lp, lt], 1), dim=1, descending=True, stable=True)
        blocks[rows] = ids.gather(1, ranked.indices[:, :kb])
        if ranked.values.shape[1] > kb:  # -inf competitors (invisible blocks) give an inf gap
            margin[rows] = (ranked.values[:, kb - 1] - ranked.values[:, kb]).float()
    positions = expand_blocks(blocks, pos, cfg)
    off = (positions - anchor[:, None] - 1).clamp(0, max(path.shape[1] - 1, 0))
    node = path.gather(1, off) if path.shape[1] else torch.zeros_like(positions)
    indices = torch.where(positions < 0, -1, torch.where(positions <= anchor[:, None], positions, p + node))
    return QSASelection(positions, indices, (positions >= 0).sum(1), scored, margin)


def selections_per_tree(sel: QSASelection, layout: TreeLayout) -> list:
    """The indexer selections a tree forward computes per anchor tree (in packing order: the order of the trees'
    nodes in the row), counted from ``sel`` (the node rows, which come last): one per scored node (its own top-k),
    plus one per depth among the nodes that saw at most block_topk blocks (they take every block: their selection
    depends only on the anchor and the depth). Trees at the same anchor count as one."""
    n = layout.num_nodes
    if n == 0:
        return []
    scored = sel.scored[-n:].cpu()
    anchor = layout.node_anchor.cpu()
    depth = ((tree_paths(layout) >= 0).sum(1) - 1).cpu()
    out = []
    for a in dict.fromkeys(anchor.tolist()):  # first appearance: packing order
        mine = anchor == a
        out.append(int(scored[mine].sum()) + len(set(depth[mine & ~scored].tolist())))
    return out
