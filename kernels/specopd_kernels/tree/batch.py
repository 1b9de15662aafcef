"""Flat varlen batch of proposal trees (several reference rows, FlashAttention/FlashInfer style cu_seqlens).

Row b occupies ``input_ids[cu_seqlens[b]:cu_seqlens[b+1]]`` and is exactly the :class:`ProposalTree` row
``[prefix_b | nodes_b]``; rows never attend to each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .naive import ProposalTree
from .packbits import FlashInferMask, flashinfer_custom_mask

__all__ = ["PackedTrees", "pack_trees_varlen"]


@dataclass(frozen=True, eq=False)
class PackedTrees:
    """B packed rows concatenated.

    input_ids, positions: int64 [T] with T = sum_b (P_b + N_b).  cu_seqlens: int32 [B+1].
    prefix_lens: int64 [B].  node_anchor, node_depth: int64 [sum N_b].  node_parent: int64 [sum N_b], index of
    the parent among its own row's nodes, -1 = anchor.  node_row: int64 [sum N_b], the row of each node.
    node_index: int64 [sum N_b], flat index of each node's token in input_ids (gather logits with it).
    trees: the B source rows.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    prefix_lens: torch.Tensor
    node_anchor: torch.Tensor
    node_parent: torch.Tensor
    node_depth: torch.Tensor
    node_row: torch.Tensor
    node_index: torch.Tensor
    trees: tuple

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return len(self.trees)

    def masks(self) -> list:
        """Per-row bool masks, row b of shape [P_b+N_b, P_b+N_b]."""
        return [t.mask() for t in self.trees]

    def block_mask(self) -> torch.Tensor:
        """bool [T, T] block-diagonal mask of the whole flat batch (small batches / tests only)."""
        return torch.block_diag(*[m.to(torch.uint8) for m in self.masks()]).bool()

    def flashinfer_mask(self) -> FlashInferMask:
        """Flattened + packed custom mask and indptrs for FlashInfer BatchPrefill (q_len = kv_len per row)."""
        return flashinfer_custom_mask(self.masks())


def pack_trees_varlen(trees: Sequence[ProposalTree]) -> PackedTrees:
    """Concatenate B :class:`ProposalTree` rows into one flat varlen batch.

    Raises ValueError on an empty sequence, TypeError if an element is not a ProposalTree.
    """
    if len(trees) == 0:
        raise ValueError("empty input: no trees to pack")
    for i, t in enumerate(trees):
        if not isinstance(t, ProposalTree):
            raise TypeError(f"trees[{i}] is {type(t).__name__}, expected ProposalTree")
    lens = torch.tensor([t.seq_len for t in trees], dtype=torch.int64)
    starts = torch.cumsum(lens, 0) - lens
    cu = torch.zeros(len(trees) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0).to(torch.int32)
    node_index = torch.cat([s + t.prefix_len + torch.arange(t.num_nodes) for s, t in zip(starts.tolist(), trees)])
    return PackedTrees(
        input_ids=torch.cat([t.input_ids for t in trees]),
        positions=torch.cat([t.positions for t in trees]),
        cu_seqlens=cu,
        prefix_lens=torch.tensor([t.prefix_len for t in trees], dtype=torch.int64),
        node_anchor=torch.cat([t.node_anchor for t in trees]),
        node_parent=torch.cat([t.node_parent for t in trees]),
        node_depth=torch.cat([t.node_depth for t in trees]),
        node_row=torch.cat([torch.full((t.num_nodes,), b, dtype=torch.int64) for b, t in enumerate(trees)]),
        node_index=node_index.to(torch.int64),
        trees=tuple(trees),
    )
