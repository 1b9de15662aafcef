"""Random GDN tree-scoring rows for tests/test_gdn_kernels.py: a synthetic layer, a packed row
``[prefix | nodes]`` of a named tree shape, the raw inputs and the state / conv window before the row."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Tuple

import torch

from _tree_attention_cases import chain_parents, random_parents
from specopd_kernels.gdn import GDNParams, GDNTreeLayout, build_gdn_tree_layout, random_gdn_params

BLOCK = 8  # DFlash block size: a chain of depth BLOCK is the deepest branch


@dataclass
class GDNCase:
    params: GDNParams
    layout: GDNTreeLayout
    x: torch.Tensor  # mixed_qkv [P+N, C]
    a: torch.Tensor  # [P+N, HV]
    b: torch.Tensor
    state: torch.Tensor  # fp32 [HV, Dv, Dk]
    window: torch.Tensor  # [C, W-1]

    def args(self):
        return self.x, self.a, self.b, self.params, self.layout, self.state, self.window


def tree_shape(shape: str, p: int, chunk: int, rng: random.Random) -> Tuple[List[int], List[List[int]]]:
    """(anchors, per-anchor local parents) of a named shape; anchors in [-1, P) (-1 only when needed or drawn).

    chain: one chain of depth BLOCK at the last token; fanout: 10 children of one anchor, then 3 children of the
    6th child and one grandchild; mixed: anchors at the start, just before a chunk boundary, random, the end and
    -1 (the initial state; -1 twice when P = 0), with chains, random trees and single nodes."""
    last = p - 1
    if shape == "chain":
        return [last], [chain_parents(1, BLOCK)]
    if shape == "fanout":
        return [rng.randrange(-1, p)], [[-1] * 10 + [5, 5, 5, 11]]
    if shape == "mixed":
        picks = [0, min(chunk - 1, last), rng.randrange(p), last, -1] if p else [-1, -1]
        trees = [chain_parents(3, 3), random_parents(rng, 9), [-1], chain_parents(2, BLOCK - 1), [-1, 0]]
        return picks, trees[: len(picks)]
    raise ValueError(shape)


def make_gdn_case(seed: int, h: int, hv: int, dk: int, dv: int, p: int, shape: str, chunk: int = 8,
                  dtype=torch.float32, zero_start: bool = False) -> GDNCase:
    """A row of prefix ``p`` with trees of ``shape``; random initial state / window unless ``zero_start``."""
    rng = random.Random(seed)
    anchors, parents = tree_shape(shape, p, chunk, rng)
    node_anchor, node_parent, off = [], [], 0
    for anc, par in zip(anchors, parents):
        node_anchor += [anc] * len(par)
        node_parent += [q + off if q >= 0 else -1 for q in par]
        off += len(par)
    layout = build_gdn_tree_layout(p, node_anchor, node_parent)
    params = random_gdn_params(h, hv, dk, dv, seed=seed, dtype=dtype, conv_bias=seed % 2 == 1)
    gen = torch.Generator().manual_seed(seed)
    t = p + layout.num_nodes
    x = torch.randn(t, params.conv_dim, generator=gen).to(dtype)
    a, b = (torch.randn(t, hv, generator=gen).to(dtype) for _ in range(2))
    state = torch.randn(hv, dv, dk, generator=gen) * 0.3
    window = torch.randn(params.conv_dim, params.conv_width - 1, generator=gen).to(dtype)
    if zero_start:
        state, window = torch.zeros_like(state), torch.zeros_like(window)
    return GDNCase(params, layout, x, a, b, state, window)
