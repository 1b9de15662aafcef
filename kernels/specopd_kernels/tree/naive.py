"""Proposal-tree packing for full-attention targets (plain torch).

One packed row is ``[prefix (P tokens) | tree nodes of every anchor]``.  The prefix is the reference
sequence (prompt + reference response).  Every anchor ``a`` (0 <= a < P, the position of the last verified
token) owns a tree of drafted tokens given by parent indices: parent ``-1`` means "child of the anchor".
A node at depth ``m`` (m = 0 for a child of the anchor) sits at position ``a + 1 + m``.

Mask rule (True = may attend), see /work/shared/notes/algorithms.md "Tree scoring, full attention" and the
SpecOPD branch-parallel scoring: prefix rows are causal; a node row sees prefix tokens ``0..a`` (anchor
included), its ancestors in the tree and itself, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = [
    "ProposalTree", "as_index_tensor", "branches_to_parents", "validate_parents", "tree_ancestors",
    "build_tree_mask", "build_tree_mask_loop", "pack_proposal_tree", "pack_branches",
]


def as_index_tensor(x, name: str) -> torch.Tensor:
    """Convert a list / tensor of integers to a 1-D int64 CPU-or-same-device tensor.

    Raises TypeError for floating / bool / complex tensors, ValueError for non-1-D input.
    """
    if isinstance(x, torch.Tensor):
        t = x
    else:
        vals = [x] if isinstance(x, int) else list(x)
        t = torch.as_tensor(vals) if vals else torch.zeros(0, dtype=torch.int64)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t.to(torch.int64)


def branches_to_parents(branch_lens: Sequence[int]) -> torch.Tensor:
    """Parent array for K chain branches concatenated in order.

    branch_lens: K non-negative ints.  Returns int64 [sum(branch_lens)] where the first node of each branch
    has parent -1 (child of the anchor) and every other node's parent is the previous node of its branch.
    Example: [2, 3] -> [-1, 0, -1, 2, 3].  Raises ValueError on a negative length.
    """
    lens = as_index_tensor(branch_lens, "branch_lens")
    if (lens < 0).any():
        raise ValueError(f"branch lengths must be >= 0, got {lens.tolist()}")
    total = int(lens.sum())
    idx = torch.arange(total, dtype=torch.int64)
    starts = torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    return torch.where(idx == starts, torch.full_like(idx, -1), idx - 1)


def validate_parents(parents: torch.Tensor, what: str = "parents") -> None:
    """Check a parent array [N] (int64): each entry is -1 or an index < its own index.

    Raises ValueError naming the first bad node: out of range (< -1 or >= N), or a self / forward reference
    (parent >= own index), which is how cycles show up.
    """
    n = parents.numel()
    idx = torch.arange(n, device=parents.device)
    bad = (parents < -1) | (parents >= n)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"{what}[{i}]={int(parents[i])} out of range: must be -1 or in [0, {n})")
    fwd = parents >= idx
    if fwd.any():
        i = int(fwd.nonzero()[0])
        raise ValueError(
            f"{what}[{i}]={int(parents[i])} is a self/forward reference (cycle): a parent must come before "
            f"its child (parent < {i})")


def tree_ancestors(node_parent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestor-or-self mask and depth of every node, by pointer jumping (loop count = max depth + 1).

    node_parent: int64 [N], already validated.  Returns (anc bool [N, N] with anc[i, j] True iff j is i or an
    ancestor of i; depth int64 [N], 0 for a child of the anchor).
    """
    n = node_parent.numel()
    dev = node_parent.device
    anc = torch.zeros(n, n, dtype=torch.bool, device=dev)
    depth = torch.full((n,), -1, dtype=torch.int64, device=dev)
    rows = torch.arange(n, device=dev)
    cur = rows.clone()
    while True:
        live = cur >= 0
        if not live.any():
            break
        anc[rows[live], cur[live]] = True
        depth += live.to(torch.int64)
        cur = torch.where(live, node_parent[cur.clamp(min=0)], cur)
    return anc, depth


def _check_nodes(prefix_len: int, node_anchor: torch.Tensor, node_parent: torch.Tensor) -> None:
    if prefix_len <= 0:
        raise ValueError(f"empty input: prefix_len must be >= 1, got {prefix_len}")
    if node_anchor.numel() != node_parent.numel():
        raise ValueError(f"node_anchor has {node_anchor.numel()} entries but node_parent has {node_parent.numel()}")
    out = (node_anchor < 0) | (node_anchor >= prefix_len)
    if out.any():
        raise ValueError(f"anchor {int(node_anchor[out][0])} out of range [0, {prefix_len})")
    validate_parents(node_parent, "node_parent")
    has_p = node_parent >= 0
    if (node_anchor[node_parent[has_p]] != node_anchor[has_p]).any():
        i = int(has_p.nonzero()[(node_anchor[node_parent[has_p]] != node_anchor[has_p]).nonzero()[0]])
        raise ValueError(f"node {i} and its parent {int(node_parent[i])} belong to different anchors")


def build_tree_mask(prefix_len: int, node_anchor, node_parent) -> torch.Tensor:
    """Dense attention mask of one packed row (vectorised torch).

    prefix_len: P >= 1.  node_anchor: int [N], anchor position of each node.  node_parent: int [N], packed
    node index of the parent or -1 (parent < own index, same anchor).
    Returns bool [P+N, P+N], True = row may attend to column.  Raises ValueError on bad input.
    """
    node_anchor = as_index_tensor(node_anchor, "node_anchor")
    node_parent = as_index_tensor(node_parent, "node_parent").to(node_anchor.device)
    _check_nodes(prefix_len, node_anchor, node_parent)
    p, n = prefix_len, node_anchor.numel()
    dev = node_anchor.device
    mask = torch.zeros(p + n, p + n, dtype=torch.bool, device=dev)
    mask[:p, :p] = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
    mask[p:, :p] = torch.arange(p, device=dev)[None, :] <= node_anchor[:, None]
    mask[p:, p:] = tree_ancestors(node_parent)[0]
    return mask


def build_tree_mask_loop(prefix_len: int, node_anchor, node_parent) -> torch.Tensor:
    """Plain Python-loop reference of :func:`build_tree_mask` (tests only; O((P+N)^2) Python ops)."""
    anchors = [int(a) for a in node_anchor]
    parents = [int(x) for x in node_parent]
    p, n = prefix_len, len(anchors)
    m = [[False] * (p + n) for _ in range(p + n)]
    for i in range(p):
        for j in range(i + 1):
            m[i][j] = True
    for i in range(n):
        for j in range(anchors[i] + 1):
            m[p + i][j] = True
        k = i
        while k != -1:
            m[p + i][p + k] = True
            k = parents[k]
    return torch.tensor(m, dtype=torch.bool)


@dataclass(frozen=True, eq=False)
class ProposalTree:
    """One packed row ``[prefix | nodes]``.

    input_ids: int64 [P+N]; positions: int64 [P+N] (prefix 0..P-1, node at depth m of anchor a: a+1+m);
    node_anchor / node_parent / node_depth: int64 [N] (node_parent indexes packed nodes, -1 = anchor);
    prefix_len: P.  Node i lives at row P+i.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    node_anchor: torch.Tensor
    node_parent: torch.Tensor
    node_depth: torch.Tensor
    prefix_len: int

    @property
    def num_nodes(self) -> int:
        """N, the number of tree nodes."""
        return int(self.node_anchor.numel())

    @property
    def seq_len(self) -> int:
        """P + N, the packed row length."""
        return self.prefix_len + self.num_nodes

    def mask(self) -> torch.Tensor:
        """bool [P+N, P+N] tree attention mask (see :func:`build_tree_mask`)."""
        return build_tree_mask(self.prefix_len, self.node_anchor, self.node_parent)


def _check_vocab(ids: torch.Tensor, vocab_size: Optional[int], what: str) -> None:
    if vocab_size is not None and ids.numel() and ((ids < 0) | (ids >= vocab_size)).any():
        bad = ids[(ids < 0) | (ids >= vocab_size)][0]
        raise ValueError(f"{what} token id {int(bad)} outside [0, {vocab_size})")


def pack_proposal_tree(prefix_ids, anchors, node_tokens: Sequence, node_parents: Optional[Sequence] = None,
                       block_size: Optional[int] = None, vocab_size: Optional[int] = None) -> ProposalTree:
    """Pack a reference prefix and one tree per anchor into a :class:`ProposalTree`.

    prefix_ids: int [P].  anchors: A ints in [0, P).  node_tokens: A sequences, the token ids of each
    anchor's nodes.  node_parents: A sequences of the same lengths with local parent indices (-1 = anchor,
    parent < own index); None means each anchor's nodes form one chain.  block_size: if given, node depth + 1
    must be <= block_size - 1 (a block drafts block_size - 1 tokens).  vocab_size: if given, every token id
    must lie in [0, vocab_size).  Raises ValueError (empty input, anchor out of range, bad parents, too deep,
    bad token id) or TypeError (non-integer ids).
    """
    prefix = as_index_tensor(prefix_ids, "prefix_ids")
    anchors_t = as_index_tensor(anchors, "anchors")
    p = prefix.numel()
    if p == 0:
        raise ValueError("empty input: prefix_ids is empty")
    if anchors_t.numel() != len(node_tokens):
        raise ValueError(f"{anchors_t.numel()} anchors but {len(node_tokens)} node_tokens entries")
    if node_parents is not None and len(node_parents) != len(node_tokens):
        raise ValueError(f"{len(node_tokens)} node_tokens entries but {len(node_parents)} node_parents entries")
    _check_vocab(prefix, vocab_size, "prefix")
    toks, anc, par = [], [], []
    offset = 0
    for j, a in enumerate(anchors_t.tolist()):
        if not 0 <= a < p:
            raise ValueError(f"anchor {a} out of range [0, {p})")
        t = as_index_tensor(node_tokens[j], f"node_tokens[{j}]")
        n = t.numel()
        if node_parents is None:
            loc = torch.arange(n, dtype=torch.int64) - 1
        else:
            loc = as_index_tensor(node_parents[j], f"node_parents[{j}]")
            if loc.numel() != n:
                raise ValueError(f"anchor {j}: {n} tokens but {loc.numel()} parents")
        validate_parents(loc, f"node_parents[{j}]")
        _check_vocab(t, vocab_size, f"anchor {j} node")
        toks.append(t)
        anc.append(torch.full((n,), a, dtype=torch.int64))
        par.append(torch.where(loc >= 0, loc + offset, loc))
        offset += n
    if offset == 0:
        raise ValueError("empty input: no tree nodes (no anchors or all trees empty)")
    node_parent = torch.cat(par)
    node_anchor = torch.cat(anc)
    depth = tree_ancestors(node_parent)[1]
    if block_size is not None and int(depth.max()) + 1 > block_size - 1:
        i = int(depth.argmax())
        raise ValueError(f"branch at anchor {int(node_anchor[i])} has {int(depth[i]) + 1} tokens > "
                         f"block_size-1 = {block_size - 1}")
    positions = torch.cat([torch.arange(p, dtype=torch.int64), node_anchor + 1 + depth])
    return ProposalTree(torch.cat([prefix] + toks), positions, node_anchor, node_parent, depth, p)


def pack_branches(prefix_ids, anchors, branches: Sequence[Sequence], block_size: int,
                  vocab_size: Optional[int] = None) -> ProposalTree:
    """Pack K chain branches per anchor (each of length <= block_size - 1) into a :class:`ProposalTree`.

    branches[j] is a list of token-id sequences, the branches sampled at anchors[j].  Each branch becomes a
    chain (parents from :func:`branches_to_parents`).  Raises ValueError with the anchor and branch index when
    a branch is longer than block_size - 1, plus everything :func:`pack_proposal_tree` raises.
    """
    if len(branches) != len(as_index_tensor(anchors, "anchors")):
        raise ValueError(f"{len(branches)} branch lists for {len(as_index_tensor(anchors, 'anchors'))} anchors")
    toks, pars = [], []
    for j, brs in enumerate(branches):
        bs = [as_index_tensor(b, f"branches[{j}][{k}]") for k, b in enumerate(brs)]
        for k, b in enumerate(bs):
            if b.numel() > block_size - 1:
                raise ValueError(f"branch {k} at anchor index {j} has length {b.numel()} > block_size-1 = "
                                 f"{block_size - 1}")
        toks.append(torch.cat(bs) if bs else torch.zeros(0, dtype=torch.int64))
        pars.append(branches_to_parents([b.numel() for b in bs]))
    return pack_proposal_tree(prefix_ids, anchors, toks, pars, block_size=block_size, vocab_size=vocab_size)
