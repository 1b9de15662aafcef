"""What a QSA tree selection reports besides its keys (issue 40 part 6): the selections it computed per anchor
tree (returned by the server in each score_trees reply, so benchmarks measure them instead of recomputing them)
and each scored row's top-k margin (the gap at the selection boundary)."""

from __future__ import annotations

import torch

from _sparse_cases import make_sparse_case
from specopd_kernels.sparse.select import qsa_tree_select, selections_per_tree
from specopd_kernels.tree import build_tree_layout



def trie_count(anchors, branches, budget: int, ratio: int) -> float:
    """An independent count (what benchmarks/tree_scoring/run.py derived in the client before the server reported
    it): per anchor tree, one selection per trie node whose query sees more than ``budget // ratio`` complete
    blocks, plus one per depth for the nodes that see fewer; the mean over the trees."""
    kb = budget // ratio
    groups = []
    for a, brs in zip(anchors, branches):
        trie = {tuple(br[: m + 1]) for br in brs for m in range(len(br))}
        scored = {node for node in trie if (a + 1 + len(node)) // ratio > kb}
        groups.append(len(scored) + len({len(node) for node in trie - scored}))
    return sum(groups) / len(groups)


def test_selections_per_tree_match_the_trie_count() -> None:
    """k chains of depth D at each anchor (distinct tokens: no shared trie nodes): the selections the selection
    computed equal the trie count."""
    p, k, depth, ratio, kb = 64, 3, 5, 4, 4
    anchors = [3, 20, 40, 63]
    parents = [[-1 if m == 0 else b * depth + m - 1 for b in range(k) for m in range(depth)] for _ in anchors]
    layout = build_tree_layout(p, anchors, parents)
    c = make_sparse_case("chain", p, ratio, kb, seed=3)
    t = p + layout.num_nodes
    gen = torch.Generator().manual_seed(0)
    iq, ik = torch.randn(t, 4, 16, generator=gen), torch.randn(t, 16, generator=gen)
    sel = qsa_tree_select(iq, ik[:p], ik[p:], layout, c.cfg)
    got = selections_per_tree(sel, layout)
    branches = [[[1000 * j + 10 * b + m for m in range(depth)] for b in range(k)] for j in range(len(anchors))]
    assert sum(got) / len(got) == trie_count(anchors, branches, c.cfg.budget, ratio)
    assert got[0] < got[-1] == k * depth  # the early anchor's nodes see few blocks: fewer selections


def test_margin_is_the_gap_at_the_selection_boundary() -> None:
    c = make_sparse_case("random", 40, 4, 2, seed=5)
    p = c.p
    sel = qsa_tree_select(c.iq, c.ik[:p], c.ik[p:], c.layout, c.cfg)
    assert sel.margin.shape == sel.scored.shape
    assert torch.isinf(sel.margin[~sel.scored]).all() and (sel.margin[sel.scored] >= 0).all()
    assert sel.scored.any() and torch.isfinite(sel.margin[sel.scored]).any()
    # recomputed for the last prefix row (anchor = itself, no path): the gap between its kb-th and (kb+1)-th
    # highest indexer logits over the prefix blocks it sees
    from specopd_kernels.sparse.indexer import qsa_block_keys, qsa_logits

    r, kb = c.cfg.compress_ratio, c.cfg.block_topk
    row = p - 1
    nb = (row + 1) // r
    keys = qsa_block_keys(c.ik[: nb * r].reshape(nb, r, -1), torch.arange(nb) * r, c.cfg)
    vals = qsa_logits(c.iq[row: row + 1], keys, c.cfg)[0].sort(descending=True).values
    assert bool(sel.scored[row]) and nb > kb
    torch.testing.assert_close(sel.margin[row], (vals[kb - 1] - vals[kb]).float(), rtol=0, atol=1e-6)
