"""SpecOPD's adapt step (``specopd adapt --algorithm specopd``): served responses as reference responses.

Per step: ``seqs_per_step`` served requests drawn from the adapter's training traffic are the references; branches
are sampled from the candidate at ``anchors_per_seq`` anchors each (plus root anchors), packed into proposal trees
and scored by the live server in one ``score_trees`` call, and the configured proposal-tree loss
(:func:`specopd_trainer.algorithms.specopd.loss.specopd_step`) is backpropagated. At T > 0 a served response is one
sample of the target, an equally valid reference prefix.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from specopd_trainer.algorithms.registry import AdaptContext, AdaptStep, NothingToTrain


def make_step(ctx: AdaptContext, cfg) -> AdaptStep:
    """The step ``step(gen) -> (loss, {"supervised_tokens", "est_tau", "score_s"})`` (forward, server scoring,
    backward). The step raises NothingToTrain when the training traffic is empty."""
    from specopd_trainer.algorithms.specopd.loss import specopd_step

    def step(gen: torch.Generator) -> Tuple[float, Dict[str, Any]]:
        train = ctx.train
        if not train:
            raise NothingToTrain("no training traffic")
        picks = torch.randint(len(train), (cfg.seqs_per_step,), generator=gen).tolist()
        loss, m = specopd_step(ctx.drafter, ctx.client, [train[i] for i in picks], cfg, gen)
        loss.backward()
        return float(loss.item()), {"supervised_tokens": int(m["supervised_tokens"]), "est_tau": float(m["est_tau"]),
                                    "score_s": float(m.get("score_s", 0.0))}

    return step
