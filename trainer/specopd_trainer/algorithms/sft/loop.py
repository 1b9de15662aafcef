"""SFT of a drafter (any registered architecture: its ``logits``, teacher-forced on the response for DFlash V2 /
DSpark) on target responses (the offline baseline SpecOPD starts from).

Per step: ``seqs_per_step`` sequences, ``anchors_per_seq`` random anchors each (response positions), one drafter
forward per sequence with the anchor-block training mask, loss ``ce_decay`` (DFlash, z-lab/dflash and SpecForge
``specforge/core/dflash.py``: w_k = exp(-(k-1)/gamma) over slots k = 1..B-1). Optimiser, schedule, checkpoints
and exact resume come from :mod:`specopd_trainer.loops.engine`. Under ``torchrun`` (:mod:`specopd_trainer.loops.parallel`,
gloo for CPU tensors, nccl for CUDA ones) with ``cfg.parallel``:

- ``ddp``: the loss module is wrapped in DDP, each rank samples its own ``seqs_per_step`` sequences and only the last
  backward of a step all-reduces;
- ``fsdp2``: the drafter is sharded (FSDP2); every rank draws the single-process step's batch from the rank-0 step
  generator and trains on its share (sequences ``rank, rank + world, ...``) in ONE forward and backward, the loss
  scaled by ``world`` so that the averaged gradient is the single-process gradient: the run is the single-process
  run, sharded.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import List

import torch

from specopd_trainer.algorithms.sft.config import SFTConfig
from specopd_trainer.loops.common import dist_info, mean_walk_tau, sample_anchors, step_generator
from specopd_trainer.loops.engine import run_training
from specopd_trainer.loops.parallel import unsharded, wrap


class DrafterLoss(torch.nn.Module):
    """The DDP-wrappable unit: drafter forward at anchors of one sequence + ce_decay loss (scalar)."""

    def __init__(self, drafter, gamma_decay: float):
        super().__init__()
        self.drafter = drafter
        self.gamma_decay = gamma_decay

    def forward(self, features, token_ids, anchors):
        from specopd_kernels.losses import ce_decay_loss

        logits, labels = self.drafter.logits(features, token_ids, anchors)
        return ce_decay_loss(logits[:, 1:], labels[:, 1:], gamma_decay=self.gamma_decay)


class ShareLoss(DrafterLoss):
    """The FSDP2 unit: a rank's whole share of a step in one forward (every rank must run exactly one forward and
    backward per step, whatever its share)."""

    def forward(self, work, scale: float):
        """``work``: [(Sequence, anchors long [n])]; returns (``scale`` * sum of the ce_decay losses, a scalar with a
        graph even for an empty share, and the unscaled sum as a float)."""
        total = sum(p.sum() for p in self.drafter.parameters() if p.requires_grad) * 0.0
        plain = 0.0
        for s, anchors in work:
            loss = super().forward(s.features.float(), s.token_ids, anchors)
            total = total + loss * scale
            plain += float(loss.detach())
        return total, plain


def train_sft(drafter, train_seqs: List, eval_seqs: List, run_dir: str | Path, cfg: SFTConfig,
              progress: bool = True) -> dict:
    """Train ``drafter`` in place on :class:`specopd_trainer.features.Sequence` lists; resumes from ``run_dir``.

    Returns the engine summary plus ``train_tokens`` (supervised draft positions of this run).
    """
    rank, world = dist_info()
    sharded = world > 1 and cfg.parallel == "fsdp2"
    module = wrap((ShareLoss if sharded else DrafterLoss)(drafter, cfg.gamma_decay), cfg.parallel, world)
    counters = {"tokens": 0, "eval_walk_tau": float("nan")}

    def sample(gen: torch.Generator):
        picks = torch.randint(len(train_seqs), (cfg.seqs_per_step,), generator=gen).tolist()
        work = [(train_seqs[i], sample_anchors(train_seqs[i].prompt_len, len(train_seqs[i].token_ids),
                                               cfg.anchors_per_seq, gen)) for i in picks]
        return [(s, a) for s, a in work if a.numel()]

    def sharded_step(step: int):
        import torch.distributed as dist

        work = sample(step_generator(cfg.seed, step, 0))  # the single-process batch, on every rank
        n = max(1, len(work))
        loss, plain = module(work[rank::world], world / n)
        loss.backward()
        total = torch.tensor(plain / n, dtype=torch.float64)
        dist.all_reduce(total)
        counters["tokens"] += sum(int(a.numel()) for _, a in work) * (drafter.block_size - 1)
        return float(total), {"train_tokens": counters["tokens"], "eval_walk_tau": counters["eval_walk_tau"]}

    def step_fn(step: int, gen: torch.Generator):
        if sharded:
            return sharded_step(step)
        work = sample(gen)
        total = 0.0
        for j, (s, anchors) in enumerate(work):
            sync = world == 1 or j == len(work) - 1
            with (contextlib.nullcontext() if sync else module.no_sync()):
                loss = module(s.features.float(), s.token_ids, anchors) / max(1, len(work))
                loss.backward()
            total += loss.item()
            counters["tokens"] += int(anchors.numel()) * (drafter.block_size - 1)
        return total, {"train_tokens": counters["tokens"], "eval_walk_tau": counters["eval_walk_tau"]}

    def on_step(step: int, metrics: dict):
        if eval_seqs and step % cfg.eval_every == 0 and (rank == 0 or sharded):
            with unsharded(module):  # FSDP2: every rank gathers, rank 0 evaluates
                if rank == 0:
                    counters["eval_walk_tau"] = mean_walk_tau(drafter, eval_seqs, cfg.eval_sequences)

    summary = run_training(drafter, step_fn, run_dir, steps=cfg.steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                           min_lr_ratio=cfg.min_lr_ratio, grad_clip=cfg.grad_clip, seed=cfg.seed,
                           log_every=cfg.log_every, ckpt_every=cfg.ckpt_every, max_minutes=cfg.max_minutes,
                           weight_decay=cfg.weight_decay, config=cfg.model_dump(), desc="SFT", on_step=on_step,
                           progress=progress)
    summary["train_tokens"] = counters["tokens"]
    return summary
