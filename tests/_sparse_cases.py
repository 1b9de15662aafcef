"""Random QSA sparse-attention rows for tests/test_sparse_kernels.py: a packed proposal-tree row of a named shape
with attention q / k / v, index queries / raw index keys and an indexer config."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Tuple

import torch

from _tree_attention_cases import chain_parents, random_parents
from specopd_kernels.sparse import QSAConfig
from specopd_kernels.tree import TreeLayout, build_tree_layout


@dataclass
class SparseCase:
    layout: TreeLayout
    cfg: QSAConfig
    q: torch.Tensor  # [P+N, Hq, D]
    k: torch.Tensor  # [P+N, Hkv, D]
    v: torch.Tensor
    iq: torch.Tensor  # [P+N, Hi, Di] index queries
    ik: torch.Tensor  # [P+N, Di] raw index keys

    @property
    def p(self) -> int:
        return self.layout.prefix_len


def tree_shape(shape: str, p: int, depth: int, rng: random.Random) -> Tuple[List[int], List[List[int]]]:
    """(anchors, per-tree parents) of a named shape on a ``p``-token prefix.

    chain: one chain of ``depth`` nodes at the last token; star: 5 children of one anchor and 3 children of the
    third child, plus 3 chains of ``depth`` at the first token; random: 4 random trees of up to 2 * depth nodes at
    anchors 0, p - 1 and two random ones."""
    if shape == "chain":
        return [p - 1], [chain_parents(1, depth)]
    if shape == "star":
        return [rng.randrange(p), 0], [[-1] * 5 + [2] * 3, chain_parents(3, depth)]
    anchors = [0, p - 1, rng.randrange(p), rng.randrange(p)]
    return anchors, [random_parents(rng, rng.randint(1, 2 * depth)) for _ in anchors]


def make_sparse_case(shape: str, p: int, ratio: int, block_topk: int, hq: int = 4, hkv: int = 2, d: int = 16,
                     hi: int = 4, di: int = 16, depth: int = 6, dtype=torch.float32, seed: int = 0) -> SparseCase:
    """A row of ``shape`` with budget ``ratio * block_topk``, a k_layernorm weight and RoPE on half the index dims."""
    rng = random.Random(seed)
    anchors, parents = tree_shape(shape, p, depth, rng)
    layout = build_tree_layout(p, anchors, parents)
    gen = torch.Generator().manual_seed(seed)
    cfg = QSAConfig(budget=ratio * block_topk, compress_ratio=ratio, k_norm_weight=0.1 * torch.randn(di, generator=gen),
                    rotary_dim=di // 2)
    t = p + layout.num_nodes
    q, k, v = (torch.randn(t, h, d, generator=gen).to(dtype) for h in (hq, hkv, hkv))
    iq = torch.randn(t, hi, di, generator=gen).to(dtype)
    ik = torch.randn(t, di, generator=gen).to(dtype)
    return SparseCase(layout, cfg, q, k, v, iq, ik)
