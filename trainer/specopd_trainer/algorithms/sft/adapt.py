"""SFT's adapt step (``specopd adapt --algorithm sft``): ce_decay on the target's own served responses, plus a
retention term that keeps what the start drafter already did well.

Per step: ``seqs_per_step`` served requests drawn uniformly from the adapter's training traffic, ``anchors_per_seq``
random response anchors each, one drafter forward per request with the anchor-block training mask. Most requests
train with :class:`specopd_trainer.algorithms.sft.loop.DrafterLoss` (ce_decay towards the served tokens). With
``ctx.retain`` > 0 that fraction of them (at least one) trains instead with the retention loss: KL(anchor || drafter)
of each slot's distribution, averaged over the slots where the frozen start drafter (``ctx.anchor``) proposed the
served token (learning without forgetting, restricted to where the start was right, so that it holds the old
traffic's behaviour without pulling the new traffic towards the start's mistakes). Those requests are drawn with
weights ``0.05 + the start drafter's mean accepted drafts per verify step`` on the request (its greedy walk over the
served response, :func:`start_well`, computed once per request): the traffic the start drafter did well, which is
what there is to keep. (Weights from the served trace instead drift, as the adapted drafter serves the new traffic
well, towards new-domain requests that need no retention: the 30-minute traffic-shift run lost -0.057 [-0.116,
-0.008] old-domain tau that way, ``benchmarks/results/history``.) Measured offline on cached
SmolLM2 responses (200 steps of 4 x 16 anchors, LR 1e-4, the shipped drafter, Japanese + word-sort responses):
old-domain greedy-walk tau 1.677 -> 1.622 with plain SFT, -> 1.662 with KL to the start on a quarter of old-domain
requests, new-domain 1.041 -> 1.449 / 1.451 (docs/adapt.md).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from specopd_trainer.algorithms.registry import AdaptContext, AdaptStep, NothingToTrain
from specopd_trainer.algorithms.sft.config import SFTConfig


def retention_loss(anchor_logits: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """KL(anchor || drafter) per slot, averaged over the slots whose anchor argmax equals the label.

    Args: anchor_logits / logits ``[nB, G, V]`` (any float dtype; computed in fp32), labels long ``[nB, G]`` (-100:
    no label). Returns a scalar (0 with a graph when no slot qualifies). Source: Li & Hoiem, "Learning without
    Forgetting" (2016), restricted to agreement slots (ours)."""
    t = torch.log_softmax(anchor_logits.float(), -1)
    q = torch.log_softmax(logits.float(), -1)
    kl = (t.exp() * (t - q)).sum(-1)
    mask = ((anchor_logits.argmax(-1) == labels) & (labels != -100)).float()
    return (kl * mask).sum() / mask.sum().clamp(min=1.0)


def start_well(anchor, seq) -> float:
    """A request's retention weight: 0.05 + the mean accepted drafts per verify step of ``anchor`` (the start
    drafter) in its greedy walk over the request's served response (``greedy_walk_tau - 1``; 0.05 alone when the
    response has no step). ``seq``: token_ids long ``[L]``, features ``[L, K*H]``, prompt_len."""
    from specopd_trainer.loops.common import greedy_walk_tau

    was_training = anchor.training
    anchor.eval()
    try:
        _, emitted, steps = greedy_walk_tau(anchor, seq.token_ids, seq.features.float(), seq.prompt_len)
    finally:
        anchor.train(was_training)
    return 0.05 + ((emitted - steps) / steps if steps else 0.0)


def make_step(ctx: AdaptContext, cfg: SFTConfig) -> AdaptStep:
    """The step ``step(gen) -> (loss, {"supervised_tokens", "retained_slots"})`` (forward and backward; the caller
    steps the optimiser). The step raises NothingToTrain when the training traffic is empty."""
    from specopd_trainer.algorithms.sft.loop import DrafterLoss
    from specopd_trainer.loops.common import sample_anchors

    module = DrafterLoss(ctx.drafter, cfg.gamma_decay)
    g = ctx.drafter.block_size - 1
    n_retain = 0 if ctx.anchor is None or ctx.retain <= 0 else max(1, round(ctx.retain * cfg.seqs_per_step))
    weights: Dict[str, float] = {}

    def step(gen: torch.Generator) -> Tuple[float, Dict[str, Any]]:
        train = ctx.train
        if not train:
            raise NothingToTrain("no training traffic")
        picks = torch.randint(len(train), (cfg.seqs_per_step - n_retain,), generator=gen).tolist()
        if n_retain:
            w = torch.tensor([weights[s.id] if s.id in weights else weights.setdefault(s.id, start_well(ctx.anchor, s))
                              for s in train], dtype=torch.float64)
            if len(weights) > 2 * len(train):  # requests dropped from the buffer: forget their weights (bounded)
                live = {s.id for s in train}
                for k in [k for k in weights if k not in live]:
                    del weights[k]
            picks = torch.multinomial(w, n_retain, replacement=True, generator=gen).tolist() + picks
        work = [(train[i], sample_anchors(train[i].prompt_len, len(train[i].token_ids), cfg.anchors_per_seq, gen))
                for i in picks]
        work = [(s, a) for s, a in work if a.numel()]
        total, tokens, retained = 0.0, 0, 0
        for j, (s, anchors) in enumerate(work):
            feats = s.features.float()
            if j < n_retain:
                with torch.no_grad():
                    target, labels = ctx.anchor.logits(feats, s.token_ids, anchors)
                logits, _ = ctx.drafter.logits(feats, s.token_ids, anchors)
                loss = retention_loss(target[:, 1:], logits[:, 1:], labels[:, 1:]) / len(work)
                retained += int((target[:, 1:].argmax(-1) == labels[:, 1:]).sum())
            else:
                loss = module(feats, s.token_ids, anchors) / len(work)
                tokens += int(anchors.numel()) * g
            loss.backward()
            total += float(loss.item())
        return total, {"supervised_tokens": tokens, "retained_slots": retained}

    return step
