"""Random proposal-tree rows for the tree-attention tests (grouped torch path, Triton kernel, backends)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List

import torch

from specopd_kernels.tree import TreeLayout, build_tree_layout, pack_proposal_tree


@dataclass
class TreeCase:
    """One packed row: layout, the dense [P+N, P+N] mask of the same row (``ProposalTree.mask``), q/k/v."""

    layout: TreeLayout
    mask: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def chain_parents(branches: int, depth: int) -> List[int]:
    """One tree of ``branches`` chains of ``depth`` nodes each (a DFlash block of depth + 1 per branch)."""
    return [-1 if m == 0 else b * depth + m - 1 for b in range(branches) for m in range(depth)]


def random_parents(rng: random.Random, n: int) -> List[int]:
    return [-1 if i == 0 or rng.random() < 0.3 else rng.randrange(i) for i in range(n)]


def make_case(p: int, anchors, parents, hq: int, hkv: int, d: int, seed: int = 0, dtype=torch.float32,
              with_mask: bool = True) -> TreeCase:
    """The row ``[prefix p | trees]`` with random q [T, hq, d], k / v [T, hkv, d] in ``dtype``."""
    layout = build_tree_layout(p, anchors, parents)
    mask = torch.ones(0, 0, dtype=torch.bool)
    if with_mask and p:
        if layout.num_nodes:  # the packing's own dense mask (build_tree_mask), independent of the layout
            mask = pack_proposal_tree([0] * p, anchors, [[0] * len(ps) for ps in parents], parents).mask()
        else:
            mask = torch.ones(p, p, dtype=torch.bool).tril()
    t = p + layout.num_nodes
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(t, h, d, generator=gen).to(dtype) for h in (hq, hkv, hkv))
    return TreeCase(layout, mask, q, k, v)


def random_case(seed: int, p: int, trees: int, max_nodes: int, hq: int, hkv: int, d: int,
                dtype=torch.float32) -> TreeCase:
    """``trees`` random trees of 0..max_nodes nodes at random anchors of a ``p``-token prefix."""
    rng = random.Random(seed)
    anchors = [rng.randrange(p) for _ in range(trees)]
    parents = [random_parents(rng, rng.randint(0, max_nodes)) for _ in anchors]
    return make_case(p, anchors, parents, hq, hkv, d, seed, dtype)


def one_node_anchors(p, g, seed=0):
    """g one-node trees at spread anchors of a p-token prefix, SmolLM2 attention dims (9 q / 3 kv heads, 64)."""
    case = make_case(p, [(i * p) // g for i in range(g)], [[-1]] * g, 9, 3, 64, seed=seed, with_mask=False)
    return case, (case.k[:p], case.v[:p])
