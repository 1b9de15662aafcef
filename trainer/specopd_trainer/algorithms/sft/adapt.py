"""SFT's adapt step (``specopd adapt --algorithm sft``): ce_decay on the target's own served responses.

Per step: ``seqs_per_step`` served requests drawn uniformly from the adapter's training traffic, ``anchors_per_seq``
random response anchors each, one drafter forward per request with the anchor-block training mask (exactly
:class:`specopd_trainer.algorithms.sft.loop.DrafterLoss`), loss averaged over the requests, backward.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from specopd_trainer.algorithms.registry import AdaptContext, AdaptStep, NothingToTrain
from specopd_trainer.algorithms.sft.config import SFTConfig


def make_step(ctx: AdaptContext, cfg: SFTConfig) -> AdaptStep:
    """The step ``step(gen) -> (loss, {"supervised_tokens"})`` (forward and backward; the caller steps the
    optimiser). The step raises NothingToTrain when the training traffic is empty."""
    from specopd_trainer.algorithms.sft.loop import DrafterLoss
    from specopd_trainer.loops.common import sample_anchors

    module = DrafterLoss(ctx.drafter, cfg.gamma_decay)
    g = ctx.drafter.block_size - 1

    def step(gen: torch.Generator) -> Tuple[float, Dict[str, Any]]:
        train = ctx.train
        if not train:
            raise NothingToTrain("no training traffic")
        picks = torch.randint(len(train), (cfg.seqs_per_step,), generator=gen).tolist()
        work = [(train[i], sample_anchors(train[i].prompt_len, len(train[i].token_ids), cfg.anchors_per_seq, gen))
                for i in picks]
        work = [(s, a) for s, a in work if a.numel()]
        total, tokens = 0.0, 0
        for s, anchors in work:
            loss = module(s.features.float(), s.token_ids, anchors) / len(work)
            loss.backward()
            total += float(loss.item())
            tokens += int(anchors.numel()) * g
        return total, {"supervised_tokens": tokens}

    return step
