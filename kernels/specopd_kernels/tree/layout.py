"""Index form of one packed row's tree mask (:class:`TreeLayout`), shared by every tree-attention backend.

A packed row is ``[prefix (P) | nodes of tree 0 | nodes of tree 1 | ...]``; tree g hangs off anchor position
``group_anchor[g]`` and its node rows see prefix columns ``0..anchor`` plus their ancestors-or-self in the tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import torch

from .naive import as_index_tensor, tree_ancestors, validate_parents

__all__ = ["TreeLayout", "build_tree_layout", "check_tree_row"]


@dataclass(frozen=True, eq=False)
class TreeLayout:
    """Index form of one packed row's tree mask.

    prefix_len: P. group_nodes: int64 [G, M], packed node index (0-based among nodes) of slot m of tree g,
    padded with 0. group_valid: bool [G, M]. group_anchor: int64 [G], the tree's anchor position (< P).
    group_anc: bool [G, M, M], ancestor-or-self inside the tree (False on padding); a node's ancestors sit in
    earlier slots of its tree. Derived (filled from the fields above when not given):
    group_sizes: host tuple of G ints, the valid slots of each tree (the first ``group_sizes[g]`` slots);
    node_anchor: int64 [N], anchor position of each packed node; node_slot: int64 [N], flat slot ``g * M + m``
    of each packed node. ``cache`` holds per-backend index tables (e.g. the Triton tile list), keyed by backend.
    """

    prefix_len: int
    group_nodes: torch.Tensor
    group_valid: torch.Tensor
    group_anchor: torch.Tensor
    group_anc: torch.Tensor
    group_sizes: Optional[Tuple[int, ...]] = None
    node_anchor: Optional[torch.Tensor] = None
    node_slot: Optional[torch.Tensor] = None
    cache: Dict[object, object] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.group_sizes is None:
            object.__setattr__(self, "group_sizes", tuple(int(x) for x in self.group_valid.sum(1).tolist()))
        if self.node_anchor is None or self.node_slot is None:
            g, m = self.group_nodes.shape
            keep = self.group_valid.reshape(-1)
            nodes = self.group_nodes.reshape(-1)[keep]
            slot = torch.empty(nodes.numel(), dtype=torch.int64, device=nodes.device)
            slot[nodes] = torch.arange(g * m, device=nodes.device)[keep]
            anchor = torch.empty_like(slot)
            anchor[nodes] = self.group_anchor[:, None].expand(g, m).reshape(-1)[keep]
            object.__setattr__(self, "node_slot", slot)
            object.__setattr__(self, "node_anchor", anchor)

    @property
    def num_nodes(self) -> int:
        """N, the number of tree nodes (valid slots)."""
        return sum(self.group_sizes)

    def to(self, device) -> "TreeLayout":
        """The same layout with every tensor on ``device`` (the host fields are kept; the cache starts empty)."""
        return TreeLayout(self.prefix_len, self.group_nodes.to(device), self.group_valid.to(device),
                          self.group_anchor.to(device), self.group_anc.to(device), self.group_sizes,
                          self.node_anchor.to(device), self.node_slot.to(device))


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


def check_tree_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout,
                   prefix_kv: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[int, int]:
    """Validate one tree-attention call (see :func:`specopd_kernels.tree.tree_attention_grouped` for the shapes).

    Returns (Hq // Hkv, row of node 0 in q: P, or 0 with ``prefix_kv``). Raises ValueError if T does not match
    the layout, the prefix K/V have the wrong length or Hq is not a multiple of Hkv."""
    t, hq = q.shape[0], q.shape[1]
    hkv = k.shape[1]
    p, n = layout.prefix_len, layout.num_nodes
    cached = prefix_kv is not None
    if t != (0 if cached else p) + n or k.shape[0] != t or v.shape[0] != t:
        raise ValueError(f"row has {t} tokens, layout expects {0 if cached else p} + {n}"
                         + (" (prefix K/V given: node rows only)" if cached else ""))
    if cached and (prefix_kv[0].shape[0] != p or prefix_kv[1].shape[0] != p):
        raise ValueError(f"prefix K/V have {prefix_kv[0].shape[0]} / {prefix_kv[1].shape[0]} rows, layout "
                         f"expects {p}")
    if hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    return hq // hkv, 0 if cached else p
