"""Pack sampled draft branches into proposal trees (tries): shared branch prefixes become shared tree nodes.

At one anchor a the drafter samples K branches x_1..x_G. Branch token m (m = 0..D-1, D = G-1 scored tokens:
the last sampled token's row would predict past the block) sits at position a+1+m and its target row depends
only on the reference prefix up to a and the branch's tokens 0..m. Branches equal on tokens 0..m therefore
share that node; the trie holds each distinct path prefix once. The target scores every node once
(``/specopd/score_trees``, general ``tokens`` + ``parents`` trees) and the loss gathers rows per branch.

Rows of one scored reference, as the server returns them: the A anchor rows first (their prediction is slot 1),
then the nodes of anchor 0's tree, anchor 1's tree, ... in the order given here. Branch n = (anchor j, branch b)
at slot i (1-based) reads row ``row_index[n, i-1]``: slot 1 = anchor row j, slot m+2 = row of its depth-m node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch


@dataclass(frozen=True)
class PackedBranches:
    """Proposal trees of one reference and the row gather map.

    tokens / parents: per anchor, the trie's node tokens and parent indices (-1 = child of the anchor), nodes
    in creation order (a parent always precedes its children). row_index: int64 ``[A*K, G]`` into the
    ``A + num_nodes`` scored rows. row_anchor / row_slot: int64 ``[A + num_nodes]``, the anchor (0..A-1) and
    the 0-based slot (0..G-1) each row predicts; row_token: int64 ``[A + num_nodes]``, the branch token sitting
    at each node row (-1 at anchor rows), i.e. the token drafted at the slot BEFORE the one the row predicts.
    row_path: int64 ``[A + num_nodes, max(D, 1)]``, the branch tokens from the anchor down to each row
    (``row_path[r, :row_slot[r]]``; 0 after them): what a semi-autoregressive drafter's q at that row is
    conditioned on (:meth:`specopd_trainer.drafters.slot_q.ConditionalSlotQ.tree_logits`).
    """

    tokens: List[List[int]]
    parents: List[List[int]]
    row_index: torch.Tensor
    row_anchor: torch.Tensor
    row_slot: torch.Tensor
    row_token: torch.Tensor
    row_path: torch.Tensor

    @property
    def num_nodes(self) -> int:
        """Tree nodes to score (excluding the anchor rows)."""
        return sum(len(t) for t in self.tokens)


def pack_branches(branches: torch.Tensor, scored_depth: int) -> PackedBranches:
    """Trie-pack ``branches`` (int64 ``[A, K, G]`` sampled tokens) keeping the first ``scored_depth`` tokens.

    Returns :class:`PackedBranches` with ``row_index [A*K, scored_depth + 1]``. Raises ValueError if
    ``branches`` is not 3-D or ``scored_depth`` is not in [0, G].
    """
    if branches.dim() != 3:
        raise ValueError(f"branches must be [A, K, G], got shape {tuple(branches.shape)}")
    a_n, k_n, g = branches.shape
    if not 0 <= scored_depth <= g:
        raise ValueError(f"scored_depth must be in [0, {g}], got {scored_depth}")
    toks = branches[:, :, :scored_depth].tolist()
    all_tokens, all_parents = [], []
    row_index = torch.empty(a_n * k_n, scored_depth + 1, dtype=torch.int64)
    row_anchor, row_slot = list(range(a_n)), [0] * a_n
    width = max(scored_depth, 1)
    row_path = [[0] * width for _ in range(a_n)]
    offset = a_n
    for j in range(a_n):
        children: dict = {}
        tokens: List[int] = []
        parents: List[int] = []
        for b in range(k_n):
            n = j * k_n + b
            row_index[n, 0] = j
            parent = -1
            for m, t in enumerate(toks[j][b]):
                key = (parent, t)
                node = children.get(key)
                if node is None:
                    node = len(tokens)
                    children[key] = node
                    tokens.append(t)
                    parents.append(parent)
                    row_anchor.append(j)
                    row_slot.append(m + 1)
                    row_path.append(toks[j][b][: m + 1] + [0] * (width - m - 1))
                row_index[n, m + 1] = offset + node
                parent = node
        all_tokens.append(tokens)
        all_parents.append(parents)
        offset += len(tokens)
    row_token = [-1] * a_n + [t for tokens in all_tokens for t in tokens]
    return PackedBranches(all_tokens, all_parents, row_index, torch.tensor(row_anchor, dtype=torch.int64),
                          torch.tensor(row_slot, dtype=torch.int64), torch.tensor(row_token, dtype=torch.int64),
                          torch.tensor(row_path, dtype=torch.int64).view(-1, width))
