"""Draft-OPD's adapt step (``specopd adapt --algorithm draft-opd``): replay at the error anchors of served traffic.

The served requests carry their verify records (anchor, proposed block, accepted count, drafter version). Per
step: up to ``rollout_prompts`` requests drawn from the adapter's training traffic, their records kept only when
served by a fresh drafter version (the deployed one or the ``max_staleness`` before it: older drafters' rejections
say little about the candidate), blocks selected as in :func:`specopd_trainer.algorithms.draft_opd.replay
.select_blocks` (error anchors by default), replayed and scored in one ``score_trees`` call, loss ``draft_opd``
(forward KL on accepted slots, gamma-weighted reverse KL on rejected ones), backward.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from specopd_trainer.algorithms.registry import AdaptContext, AdaptStep, NothingToTrain


class NoFreshBlocks(NothingToTrain):
    """No training request has a replayable block served by a fresh drafter version yet (wait for traffic)."""


def make_step(ctx: AdaptContext, cfg) -> AdaptStep:
    """The step ``step(gen) -> (loss, metrics)``; the step raises :class:`NoFreshBlocks` when nothing is fresh."""
    from specopd_trainer.algorithms.draft_opd.replay import draft_opd_step, select_blocks
    from specopd_trainer.algorithms.draft_opd.rollouts import TracedRollout, verify_records

    drafter = ctx.drafter
    g, layer_ids = drafter.block_size - 1, list(drafter.spec.target_layer_ids)

    def step(gen: torch.Generator) -> Tuple[float, Dict[str, Any]]:
        train = ctx.train
        fresh = ctx.fresh_versions()
        if not train:
            raise NoFreshBlocks("no training traffic")
        picks = torch.randperm(len(train), generator=gen)[:max(1, cfg.rollout_prompts)].tolist()
        rollouts = []
        for i in sorted(picks):
            s = train[i]
            recs = [r for r in verify_records(s.records, drafter.block_size) if r.drafter_version in fresh]
            if recs:
                rollouts.append(TracedRollout(s.token_ids.tolist(), s.prompt_len, recs))
        selected = select_blocks(rollouts, g, cfg.anchors, cfg.max_blocks, gen)
        if not selected:
            raise NoFreshBlocks(f"no replayable block served by a fresh drafter ({sorted(fresh)}) in "
                                f"{len(picks)} requests")
        loss, m = draft_opd_step(drafter, ctx.client, selected, layer_ids, loss=cfg.loss, gamma=cfg.gamma,
                                 lambda_acc=cfg.lambda_acc, lambda_rej=cfg.lambda_rej, head_dtype=cfg.head_dtype,
                                 rejected_slots=cfg.rejected_slots)
        loss.backward()
        return float(loss.item()), {"supervised_tokens": int(m["step_supervised_tokens"]),
                                    "est_tau": float(m["est_tau"]), "blocks": int(m["blocks"]),
                                    "score_s": float(m["score_s"])}

    return step
