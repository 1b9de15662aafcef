"""Stand-ins for ``SpecOPDClient.score_trees`` in SpecOPD step tests: :class:`Scorer` (random rows in the endpoint's
layout), :class:`KeepScorer` (also keeps every reply), :class:`HashScorer` (rows that depend only on the request)
and :func:`record_packing` (records every ``pack_branches`` call); used by test_specopd_step.py,
test_tree_q_archs.py and the FSDP worker _fsdp_specopd_worker.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch


class Scorer:
    """Stands in for ``SpecOPDClient.score_trees``: records the request, returns random final hidden states with
    one row per anchor plus one per tree node (the endpoint's row layout)."""

    def __init__(self):
        self.requests = []

    def score_trees(self, req):
        self.requests.append(req)
        g = torch.Generator().manual_seed(len(self.requests))
        return [SimpleNamespace(hidden=torch.randn(len(r.trees) + sum(len(t.tokens) for t in r.trees), 32,
                                                   generator=g)) for r in req.references]


class KeepScorer(Scorer):
    """A :class:`Scorer` that also keeps every reply."""

    def __init__(self):
        super().__init__()
        self.outputs = []

    def score_trees(self, req):
        out = super().score_trees(req)
        self.outputs.extend(out)
        return out


def record_packing(monkeypatch) -> list:
    """Record (branches, PackedBranches) of every ``pack_branches`` call of the step."""
    import specopd_trainer.loops.branch_tree as bt

    packed = []
    real = bt.pack_branches
    monkeypatch.setattr(bt, "pack_branches", lambda branches, depth: packed.append((branches.clone(),
                                                                                    real(branches, depth))) or packed[-1][1])
    return packed


class HashScorer(Scorer):
    """Rows that depend only on the request's content (a resumed run sees the same rows as an uninterrupted one)."""

    def score_trees(self, req):
        self.requests.append(req)
        out = []
        for r in req.references:
            g = torch.Generator().manual_seed(sum((j + 1) * t.anchor for j, t in enumerate(r.trees)))
            out.append(SimpleNamespace(hidden=torch.randn(len(r.trees) + sum(len(t.tokens) for t in r.trees), 32,
                                                          generator=g)))
        return out
