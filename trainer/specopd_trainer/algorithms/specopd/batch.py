"""One SpecOPD scored batch and its minibatch losses: sample + score once, train ``minibatches`` optimizer steps.

A scored batch (:func:`sample_and_score`) picks ``minibatches x anchors_per_seq`` branch anchors per sequence,
samples K branches at every one from the current drafter and scores ALL of them in ONE ``/specopd/score_trees``
call, so the target computes each reference prefix once for ``minibatches`` times more branches (the prefix is
the fixed part of a tree forward's cost: measured ~0.2 s per 434-token SmolLM2 reference on 2 CPU cores, against
~0.5 ms per tree row). The branch anchors are split at random into ``minibatches`` disjoint shares of
``anchors_per_seq`` per sequence, each with ``root_anchors_per_seq`` root anchors of its own (prefix rows: free to
score, so drawn afresh per share); :func:`specopd_trainer.algorithms.specopd.loss.minibatch_loss` computes one share's loss with the drafter as it is at that optimizer step (its
q, alpha and acceptance ratios are the current drafter's; only the branch tokens were drawn from the drafter of
the batch's first step, a few optimizer steps older: PPO-style minibatch reuse). ``minibatches = 1`` is the plain
SpecOPD step: the sampling forward is the loss forward.

The drafter's forward runs under ``torch.autocast`` in ``cfg.compute_dtype`` (bf16 matmuls on AMX / tensor
cores; the weights and the optimizer stay fp32), the loss in fp32.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch


@dataclass
class Share:
    """One sequence's share of one minibatch: its branch anchors, root anchors, packed branches and target rows.

    ``hidden``: fp32 ``[A + R + nodes, H]`` target final hidden states (branch-anchor rows, root-anchor rows, tree
    nodes); ``q``: the drafter's q at the share's anchors and roots (``drafter.slot_q``, with its graph) when the
    sampling forward is reused (``minibatches = 1``), else None (recomputed at the share's step)."""

    seq: object
    anchors: torch.Tensor
    roots: torch.Tensor
    packed: object
    ref: Optional[torch.Tensor]
    hidden: Optional[torch.Tensor] = None
    q: Optional[object] = None


@dataclass
class ScoredBatch:
    """``parts[m]``: the shares (one per sequence) of minibatch m; wall seconds of sampling and scoring."""

    parts: List[List[Share]]
    draft_s: float
    score_s: float


def compute_autocast(cfg, device: torch.device):
    """``torch.autocast`` in ``cfg.compute_dtype`` on ``device`` (a no-op context for float32)."""
    if cfg.compute_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, cfg.compute_dtype))


def _split_anchors(s, cfg, minibatches: int, gen: torch.Generator):
    """Per minibatch (branch anchors ``[A]``, root anchors ``[R]``): sorted int64, uniform at random over the
    response positions, disjoint within a minibatch. Branch anchors are disjoint across minibatches (each costs
    tree rows); root anchors are drawn afresh for every minibatch (their target rows are prefix rows, scored once
    per sequence whatever the count), so a short response still gives every minibatch ``R`` of them."""
    from specopd_trainer.loops.common import sample_anchors

    a_n, r_n = cfg.anchors_per_seq, cfg.root_anchors_per_seq
    if minibatches == 1:
        picked = sample_anchors(s.prompt_len, len(s.token_ids), a_n + r_n, gen)
        if r_n == 0 or picked.numel() == 0:
            return [(picked, picked[:0])]
        order = torch.randperm(picked.numel(), generator=gen)  # anchors_per_seq of them get branches
        return [(picked[order[:a_n]].sort().values, picked[order[a_n:]].sort().values)]
    positions = sample_anchors(s.prompt_len, len(s.token_ids), len(s.token_ids), gen)  # every response position
    branch = positions[torch.randperm(positions.numel(), generator=gen)[: minibatches * a_n]]
    if 0 < branch.numel() < minibatches:  # a short response: every minibatch still gets a branch anchor
        branch = branch.repeat(minibatches)[:minibatches]
    out = []
    for m in range(minibatches):
        mine = branch[m::minibatches].sort().values
        free = positions[~torch.isin(positions, mine)]
        roots = free[torch.randperm(free.numel(), generator=gen)[:r_n]].sort().values
        out.append((mine, roots))
    return out


def sample_and_score(drafter, client, seqs: List, cfg, gen: torch.Generator,
                     minibatches: Optional[int] = None) -> ScoredBatch:
    """Sample branches for every share of a scored batch and score them all in one server call.

    ``minibatches`` defaults to ``cfg.minibatches``. With one minibatch the drafter forward keeps its graph (the
    loss reuses it); otherwise it runs without gradient (sampling only). Raises ValueError when no sequence has a
    response position to anchor at, RuntimeError when the server returns the wrong number of rows."""
    from specopd_trainer.loops.branch_tree import pack_branches
    from specopd_trainer.algorithms.specopd.sampling import draft_slot_q, reference_blocks

    mb = minibatches or cfg.minibatches
    g = drafter.block_size - 1
    t0 = time.monotonic()
    per_seq: List[List[Share]] = []
    for s in seqs:
        splits = _split_anchors(s, cfg, mb, gen)
        if not splits or all(a.numel() == 0 for a, _ in splits):
            continue
        with compute_autocast(cfg, drafter._device()), torch.set_grad_enabled(mb == 1):
            all_anchors = torch.cat([a for a, _ in splits])
            q_all = draft_slot_q(drafter, s, all_anchors, splits[0][1] if mb == 1 else splits[0][1][:0],
                                 cfg.compute_dtype)
        shares, lo = [], 0
        for anchors, roots in splits:
            q = q_all if mb == 1 else q_all.take(lo, lo + anchors.numel())
            lo += anchors.numel()
            branches = q.sample(cfg.branches, cfg.temperature, gen)  # [A, K, G], each slot from its conditional q
            if cfg.greedy_branch:
                branches[:, 0] = q.greedy()  # the block the served drafter proposes at temperature 0
            ref = None
            if cfg.reference_branch > 0:  # branch K of every anchor: the reference continuation (T=0 served path)
                ref = reference_blocks(s.token_ids, anchors, g)
                branches = torch.cat([branches, ref.clamp(min=0)[:, None]], dim=1)
            sh = Share(s, anchors, roots, pack_branches(branches, g - 1), ref)
            if mb == 1:
                sh.q = q
            shares.append(sh)
        per_seq.append(shares)
    if not per_seq:
        raise ValueError("no sequence of this step has a response position to anchor at")
    t1 = time.monotonic()
    plans = [_tree_plan(shares) for shares in per_seq]
    scored = client.score_trees(_request(per_seq, plans, drafter.block_size))
    for shares, plan, sc in zip(per_seq, plans, scored):
        _attach_rows(shares, plan, sc.hidden)
    return ScoredBatch([list(p) for p in zip(*per_seq)], draft_s=t1 - t0, score_s=time.monotonic() - t1)


def _tree_plan(shares: List[Share]):
    """One reference's trees: every share's branch trees (minibatch order), then a node-less tree per root anchor
    that is no branch anchor (sorted, each once). Returns (trees, anchor_row: anchor -> its tree's row)."""
    trees = [{"anchor": int(a), "tokens": sh.packed.tokens[j], "parents": sh.packed.parents[j]}
             for sh in shares for j, a in enumerate(sh.anchors.tolist())]
    anchor_row: Dict[int, int] = {}
    for t, tree in enumerate(trees):
        anchor_row.setdefault(tree["anchor"], t)
    for a in sorted({a for sh in shares for a in sh.roots.tolist()} - set(anchor_row)):
        anchor_row[a] = len(trees)
        trees.append({"anchor": a, "tokens": []})
    return trees, anchor_row


def _request(per_seq: List[List[Share]], plans, block_size: int):
    """The batch's one score_trees request (``plans``: :func:`_tree_plan` per sequence)."""
    from sglang_specopd.wire.protocol import ScoreTreesRequest

    refs = [{"input_ids": shares[0].seq.token_ids.tolist(), "trees": trees}
            for shares, (trees, _) in zip(per_seq, plans)]
    return ScoreTreesRequest(references=refs, block_size=block_size, returns=["hidden"], output_dtype="float32")


def _attach_rows(shares: List[Share], plan, hidden: torch.Tensor) -> None:
    """Give each share its rows of one reference's reply (every tree's anchor row in tree order, then every tree's
    nodes): ``[its branch-anchor rows, its root rows, its nodes]``; ``plan``: the reference's :func:`_tree_plan`."""
    trees, anchor_row = plan
    want = len(trees) + sum(sh.packed.num_nodes for sh in shares)
    if hidden.shape[0] != want:
        raise RuntimeError(f"score_trees returned {hidden.shape[0]} rows, expected {want}")
    a_off, n_off = 0, len(trees)
    for sh in shares:
        a_n, nodes = sh.anchors.numel(), sh.packed.num_nodes
        roots = torch.tensor([anchor_row[a] for a in sh.roots.tolist()], dtype=torch.long)
        sh.hidden = torch.cat([hidden[a_off: a_off + a_n], hidden[roots], hidden[n_off: n_off + nodes]])
        a_off, n_off = a_off + a_n, n_off + nodes
