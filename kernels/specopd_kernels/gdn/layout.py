"""Index form of one packed row for GDN tree scoring (:class:`GDNTreeLayout`): node parents / anchors, depth
levels, per-row conv-window indices and the walk tables of the Triton kernel.

The row is ``[prefix (P) | nodes (N)]`` as in :mod:`specopd_kernels.tree` (node i at row P + i; node_parent
indexes packed nodes, -1 = child of the anchor, parent < own index, same anchor). A node's sequence is prefix
tokens ``0..anchor`` then its ancestors then itself; anchor -1 means the tree hangs off the state before the
row (``initial_state`` / ``initial_window``: a prefix already run elsewhere, e.g. cached in SGLang's pool).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch

from ..tree.layout import TreeLayout
from ..tree.naive import as_index_tensor, validate_parents

__all__ = ["GDNTreeLayout", "WalkTables", "build_gdn_tree_layout", "check_gdn_row", "gdn_layout_from_tree_layout"]


@dataclass(frozen=True)
class WalkTables:
    """Triton walk plan: nodes grouped into root subtrees (a depth-0 node and its descendants; subtrees only
    share their anchor's state, so each is one independent program), in topological order.

    unit_ptr: int32 [R+1], walk positions of subtree r are ``unit_ptr[r]:unit_ptr[r+1]``; unit_anchor: int32 [R],
    anchor slot of subtree r; walk_node: int32 [N], packed node at each walk position; walk_load: int32 [N], -1
    when the node's parent state is the running one (the root, or the parent is the previous walk position),
    else the scratch slot holding the parent's state; walk_save: int32 [N], scratch slot to store the node's
    state in (it has a child that is not the next walk position), else -1; num_saved: scratch slots needed.
    """

    unit_ptr: torch.Tensor
    unit_anchor: torch.Tensor
    walk_node: torch.Tensor
    walk_load: torch.Tensor
    walk_save: torch.Tensor
    num_saved: int


@dataclass(frozen=True, eq=False)
class GDNTreeLayout:
    """Index form of one packed row ``[prefix (P) | nodes (N)]`` for GDN scoring (CPU tensors, int64).

    node_anchor: [N] in [-1, P); node_parent: [N]; node_depth: [N] (0 = child of the anchor); anchors: [A], the
    distinct anchors, sorted; node_anchor_slot: [N], index of each node's anchor in ``anchors``; levels: per
    depth d the nodes of depth d (ascending); level_pos: [N], a node's position in its level. ``cache`` holds
    the tables derived per conv width / device (:meth:`conv_index`, :meth:`walk`).
    """

    prefix_len: int
    node_anchor: torch.Tensor
    node_parent: torch.Tensor
    node_depth: torch.Tensor
    anchors: torch.Tensor
    node_anchor_slot: torch.Tensor
    levels: Tuple[torch.Tensor, ...]
    level_pos: torch.Tensor
    cache: Dict[object, object] = field(default_factory=dict, repr=False)

    @property
    def num_nodes(self) -> int:
        """N, the number of tree nodes."""
        return int(self.node_anchor.numel())

    def conv_index(self, width: int) -> torch.Tensor:
        """int64 [P+N, width]: each row's conv window (oldest first, the row itself last) as indices into the
        extended input ``[initial window (width-1 columns as rows) | the P+N rows]``. Prefix token t sits at
        ``t + width - 1`` (t < 0: initial-window column ``t + width - 1``), node i at ``P + i + width - 1``; a
        node's window walks up its ancestors, then into prefix tokens anchor, anchor-1, ... Cached per width."""
        key = ("conv", width)
        hit = self.cache.get(key)
        if hit is None:
            w1, p, n = width - 1, self.prefix_len, self.num_nodes
            pred = torch.arange(-1, w1 + p + n - 1, dtype=torch.int64)  # window and prefix: the previous token
            pred[w1 + p:] = torch.where(self.node_parent >= 0, self.node_parent + w1 + p, self.node_anchor + w1)
            cols = [torch.arange(w1, w1 + p + n, dtype=torch.int64)]
            for _ in range(w1):
                cols.append(pred[cols[-1]].clamp(min=0))  # clamp: only reached past the window, never read
            hit = torch.stack(cols[::-1], 1)
            self.cache[key] = hit
        return hit

    def walk(self) -> WalkTables:
        """The Triton walk plan (:class:`WalkTables`), built once and cached."""
        hit = self.cache.get("walk")
        if hit is None:
            n = self.num_nodes
            root = torch.arange(n, dtype=torch.int64)
            for level in self.levels[1:]:  # parents are one level up, already resolved
                root[level] = root[self.node_parent[level]]
            order = torch.sort(root, stable=True).indices  # by subtree, packed (= topological) order inside
            prev = torch.full((n,), -1, dtype=torch.int64)
            prev[order[1:]] = order[:-1]
            par = self.node_parent
            load_from_saved = (par >= 0) & (par != prev)
            saved = torch.zeros(n, dtype=torch.bool)
            saved[par[load_from_saved]] = True
            slot = torch.cumsum(saved, 0) - 1
            walk_save = torch.where(saved, slot, -1)[order]
            walk_load = torch.where(load_from_saved, slot[par.clamp(min=0)], -1)[order]
            roots = (self.node_depth == 0).nonzero().flatten()
            sizes = torch.bincount(root, minlength=n)[roots]
            ptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])
            i32 = torch.int32
            hit = WalkTables(ptr.to(i32), self.node_anchor_slot[roots].to(i32), order.to(i32), walk_load.to(i32),
                             walk_save.to(i32), int(saved.sum()))
            self.cache["walk"] = hit
        return hit


def build_gdn_tree_layout(prefix_len: int, node_anchor, node_parent) -> GDNTreeLayout:
    """Layout of a packed row from packed node arrays (as in :class:`specopd_kernels.tree.ProposalTree`).

    prefix_len: P >= 0. node_anchor: N ints in [-1, P). node_parent: N ints, -1 or an earlier node with the same
    anchor. Raises ValueError on a negative P, mismatched lengths, out-of-range anchors, bad parents (out of
    range, self / forward reference) or a parent with another anchor; TypeError on non-integer input.
    """
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    anchor = as_index_tensor(node_anchor, "node_anchor").cpu()
    parent = as_index_tensor(node_parent, "node_parent").cpu()
    if anchor.numel() != parent.numel():
        raise ValueError(f"node_anchor has {anchor.numel()} entries but node_parent has {parent.numel()}")
    bad = (anchor < -1) | (anchor >= prefix_len)
    if bad.any():
        raise ValueError(f"anchor {int(anchor[bad][0])} out of range [-1, {prefix_len})")
    validate_parents(parent, "node_parent")
    has = parent >= 0
    other = has & (anchor[parent.clamp(min=0)] != anchor)
    if other.any():
        i = int(other.nonzero()[0])
        raise ValueError(f"node {i} and its parent {int(parent[i])} belong to different anchors")
    n = anchor.numel()
    depth = torch.zeros(n, dtype=torch.int64)
    while True:  # depth = parent's depth + 1, propagated down: converges after max depth + 1 rounds
        new = torch.where(has, depth[parent.clamp(min=0)] + 1, 0)
        if torch.equal(new, depth):
            break
        depth = new
    anchors, slot = torch.unique(anchor, sorted=True, return_inverse=True)
    levels = tuple((depth == d).nonzero().flatten() for d in range(int(depth.max()) + 1 if n else 0))
    level_pos = torch.zeros(n, dtype=torch.int64)
    for level in levels:
        level_pos[level] = torch.arange(level.numel())
    return GDNTreeLayout(prefix_len, anchor, parent, depth, anchors, slot.to(torch.int64), levels, level_pos)


def gdn_layout_from_tree_layout(layout: TreeLayout) -> GDNTreeLayout:
    """The GDN layout of a tree-attention :class:`~specopd_kernels.tree.TreeLayout` row (so a hybrid target
    scores its full-attention and GDN layers from one packing). A node's parent is its deepest proper ancestor
    in ``group_anc`` (ancestors sit in earlier slots; the parent is the latest)."""
    g, m = layout.group_nodes.shape
    anc = layout.group_anc.cpu() & ~torch.eye(m, dtype=torch.bool)[None]
    slots = torch.arange(m, dtype=torch.int64)
    parent_slot = torch.where(anc, slots, -1).amax(-1) if m else torch.zeros(g, 0, dtype=torch.int64)
    nodes = layout.group_nodes.cpu()
    packed_parent = torch.where(parent_slot >= 0, torch.gather(nodes, 1, parent_slot.clamp(min=0)), -1)
    keep = layout.group_valid.cpu().reshape(-1)
    node_parent = torch.empty(layout.num_nodes, dtype=torch.int64)
    node_parent[nodes.reshape(-1)[keep]] = packed_parent.reshape(-1)[keep]
    return build_gdn_tree_layout(layout.prefix_len, layout.node_anchor.cpu(), node_parent)


def check_gdn_row(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, params, layout: GDNTreeLayout,
                  initial_state: Optional[torch.Tensor], initial_window: Optional[torch.Tensor]
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validate one GDN tree-scoring call (shapes as :func:`specopd_kernels.gdn.gdn_tree_replay`; ``params`` a
    :class:`~specopd_kernels.gdn.GDNParams`). Returns (initial state fp32 [HV, Dv, Dk], initial window [C, W-1]
    in mixed_qkv's dtype), zeros where None. Raises ValueError naming the mismatch."""
    t = layout.prefix_len + layout.num_nodes
    hv, c, w1 = params.num_v_heads, params.conv_dim, params.conv_width - 1
    if mixed_qkv.dim() != 2 or mixed_qkv.shape != (t, c):
        raise ValueError(f"mixed_qkv must be [P+N, C] = {(t, c)} (layout {layout.prefix_len} + "
                         f"{layout.num_nodes}), got {tuple(mixed_qkv.shape)}")
    if a.shape != (t, hv) or b.shape != (t, hv):
        raise ValueError(f"a and b must be [P+N, HV] = {(t, hv)}, got {tuple(a.shape)}, {tuple(b.shape)}")
    shape = (hv, params.head_v_dim, params.head_k_dim)
    dev = mixed_qkv.device
    state = torch.zeros(shape, device=dev) if initial_state is None else initial_state.to(dev, torch.float32)
    if state.shape != shape:
        raise ValueError(f"initial_state must be [HV, Dv, Dk] = {shape}, got {tuple(state.shape)}")
    window = mixed_qkv.new_zeros(c, w1) if initial_window is None else initial_window.to(dev, mixed_qkv.dtype)
    if window.shape != (c, w1):
        raise ValueError(f"initial_window must be [C, W-1] = {(c, w1)}, got {tuple(window.shape)}")
    return state, window
