"""The Draft-OPD loop's fake server (:class:`FakeServer`: rollouts with traces, the served drafter version, score_trees
rows and features that depend only on the request, a traffic spool), its pusher and config helpers; used by
test_draft_opd_loop.py, test_tree_q_archs.py, test_trainer_fsdp.py and the DDP worker _dist_draft_opd_worker.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch


G = 3  # the tiny drafter's block size is 4


def randn(seed: int, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed % (2**31)))


class FakeServer:
    """Stands in for SpecOPDClient: greedy-like rollouts with traces (depending only on the prompt), the drafter
    version it serves (set by pushes), score_trees rows and features that depend only on the request's content
    (so a resumed run sees what the uninterrupted one saw), and a recorded-traffic spool."""

    def __init__(self, stale_first: bool = False):
        self.version, self.stale_first = "init", stale_first
        self.score_calls, self.generated, self.purged, self.spool = 0, 0, 0, []

    def _request(self, method, path, **_):
        return SimpleNamespace(json=lambda: {"version": self.version})

    def generate(self, p, *, max_new_tokens, temperature=0.0, trace=False):
        self.generated += 1
        ids = list(p) + [(sum(p) * 7 + 13 * i) % 93 + 4 for i in range(max_new_tokens)]
        recs, a = [], len(p) - 1
        while a < len(ids) - 1:
            acc = (a * 5 + sum(p)) % (G + 1)
            version = "ancient" if self.stale_first and not recs else self.version
            recs.append({"anchor": a, "proposed": [(a * 3 + j) % 93 + 4 for j in range(G)], "accepted": acc,
                         "drafter_version": version})
            a += acc + 1
        return {"output_ids": ids[len(p):], "meta_info": {"specopd_trace": recs,
                                                          "specopd_drafter_versions": [self.version]}}

    def score_trees(self, req):
        self.score_calls += 1
        out = []
        for r in req.references:
            seed = sum((i + 1) * t for i, t in enumerate(r.input_ids))
            rows = len(r.trees) + sum(len(t.tokens) for t in r.trees)
            tree_seed = sum((j + 1) * (t.anchor + 1) * (1 + sum(t.tokens)) for j, t in enumerate(r.trees))
            out.append(SimpleNamespace(hidden=randn(seed + tree_seed, rows, 32) if rows else None,
                                       features=randn(seed, len(r.input_ids), 32)))
        return out

    def traffic(self, max_items):
        return self.spool[:max_items]

    def purge_traffic(self):
        self.purged += 1
        self.spool = []


def pusher(server: FakeServer, log: list):
    def push(step, drafter):
        server.version = f"draftopd-run-step{step}"
        log.append(step)
        return server.version
    return push


PROMPTS = [[5, 9, 11, 20, 31], [7, 7, 8, 40], [60, 2, 19, 33, 8, 12]]


def draft_opd_config(**kw):
    from specopd_trainer.algorithms.draft_opd.config import DraftOPDConfig

    base = dict(steps=4, rollout_prompts=2, rollout_tokens=12, concurrency=2, push_every=2, ckpt_every=2,
                warmup_steps=0, lr=1e-2, min_lr_ratio=1.0, head_dtype="float32")
    return DraftOPDConfig(**{**base, **kw})
