"""SpecOPD against a live server: the DDP-wrappable step and the training run on the shared engine.

:func:`train_specopd` drives one scored batch per ``cfg.minibatches`` optimizer steps (:mod:`.batch`: drafter
forward at anchors, K branches sampled from the drafter, ONE ``/specopd/score_trees`` call; :mod:`.loss`: the
registry's tree loss) on :func:`specopd_trainer.loops.engine.run_training` (AdamW, warmup + cosine, atomic
checkpoints, exact resume from the run directory). Under ``torchrun`` (gloo for CPU tensors, nccl for CUDA ones) the step is
wrapped as ``cfg.parallel`` says (:mod:`specopd_trainer.loops.parallel`): ``ddp``: each rank samples its own
``seqs_per_step`` sequences with its per-rank step generator and scores them with its own server call, the backward
all-reduces; ``fsdp2``: the drafter is sharded, every rank draws the single-process step's ``seqs_per_step``
sequences (rank-0 step generator) and samples and scores its share (sequences ``rank, rank + world, ...``; branches
from its per-rank generator), the backward reduce-scatters the averaged gradient, a push gathers the full drafter
first. Only rank 0 logs, checkpoints and pushes.

Metrics (one ``metrics.jsonl`` row per logged step, besides the engine's step/loss/lr/grad_norm/wall_s):
``est_tau``, ``alpha`` (per slot), ``step_supervised_tokens`` (this step, summed over ranks), the cumulative
``supervised_tokens`` / ``supervised_wall_s`` / ``supervised_tokens_per_s`` (:mod:`specopd_trainer.loops.counters`,
resumes included) and every other int/float metric the step returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import torch

from specopd_trainer.algorithms.registry import PushFn, ShardingRefusedError
from specopd_trainer.algorithms.specopd.batch import sample_and_score
from specopd_trainer.algorithms.specopd.loss import minibatch_loss
from specopd_trainer.loops.common import dist_info, step_generator
from specopd_trainer.loops.counters import Counters, passthrough
from specopd_trainer.loops.engine import run_training
from specopd_trainer.loops.parallel import pushable, wrap


def _reduce(loss: float, tau: float, alpha: List[float], tokens: int, world: int):
    """Across ranks: mean loss, est_tau and alpha; summed supervised tokens."""
    import torch.distributed as dist

    t = torch.tensor([loss, tau, float(tokens), *alpha], dtype=torch.float64)
    dist.all_reduce(t)
    v = t.tolist()
    return v[0] / world, v[1] / world, [a / world for a in v[3:]], int(round(v[2]))


class _SpecOPDStep(torch.nn.Module):
    """The DDP-wrappable unit: one minibatch's loss (:mod:`.batch`, :mod:`.loss`); minibatch 0
    first samples and scores the batch (drafter forward, sampling, ONE server call) and keeps it for the others."""

    def __init__(self, drafter, client, cfg):
        super().__init__()
        self.drafter = drafter
        self._client = client
        self._cfg = cfg
        self.batch = None

    def forward(self, seqs, gen, part: int):
        if part == 0:
            self.batch = None  # free the previous batch's rows first
            self.batch = sample_and_score(self.drafter, self._client, seqs, self._cfg, gen)
        return minibatch_loss(self.drafter, self.batch, part, self._cfg)


def train_specopd(drafter, client, train_seqs: List, run_dir: str | Path, cfg, *, push: Optional[PushFn] = None,
                  progress: bool = True) -> dict:
    """Train ``drafter`` in place with SpecOPD against the server behind ``client``; resumes from ``run_dir``.

    Args:
        train_seqs: :class:`specopd_trainer.features.Sequence` list (reference responses with context features).
        cfg: :class:`specopd_trainer.algorithms.specopd.config.SpecOPDConfig`.
        push: ``push(step, drafter)``, called on rank 0 every ``cfg.push_every`` steps (0: never during the
            run) and once at the end (unless the last step was just pushed).

    Returns the engine summary plus ``supervised_tokens``, ``supervised_tokens_per_s`` (cumulative over the
    run's resumes), ``start_step`` and ``pushed`` (the steps pushed by this call). Raises ValueError without
    sequences, :class:`ShardingRefusedError` under FSDP2 with fewer ``seqs_per_step`` than ranks.
    """
    if not train_seqs:
        raise ValueError("no training sequences")
    rank, world = dist_info()
    sharded = world > 1 and cfg.parallel == "fsdp2"
    if sharded and cfg.seqs_per_step < world:
        raise ShardingRefusedError(f"SpecOPD with parallel=fsdp2 splits each step's sequences across ranks: "
                                   f"seqs_per_step ({cfg.seqs_per_step}) must be at least the {world} ranks")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # DDP: the target head's (non-persistent) buffers are loaded identically on every rank: no per-step broadcast
    module = wrap(_SpecOPDStep(drafter, client, cfg), cfg.parallel, world, broadcast_buffers=False)
    counters = Counters(run_dir, cfg.ckpt_every, rank, cfg.minibatches)
    pushed: List[int] = []
    batch_start = [None]  # the step whose generator sampled the scored batch in use

    def step_fn(step: int, gen: torch.Generator):
        if batch_start[0] is None or step - batch_start[0] >= cfg.minibatches:
            batch_start[0] = step
        part = step - batch_start[0]
        seqs = []
        if part == 0:
            pick_gen = step_generator(cfg.seed, step, 0) if sharded else gen
            picks = torch.randint(len(train_seqs), (cfg.seqs_per_step,), generator=pick_gen).tolist()
            seqs = [train_seqs[i] for i in (picks[rank::world] if sharded else picks)]
        loss, m = module(seqs, gen, part)
        loss.backward()
        value, tau = float(loss.item()), float(m["est_tau"])
        alpha, tokens = [float(a) for a in m["alpha"]], int(m["supervised_tokens"])
        if world > 1:
            value, tau, alpha, tokens = _reduce(value, tau, alpha, tokens, world)
        out = passthrough(m, {"alpha", "est_tau", "supervised_tokens"})
        out.update({"est_tau": tau, "alpha": alpha, "step_supervised_tokens": tokens})
        out.update(counters.add(step + 1, tokens))
        return value, out

    def on_step(step: int, metrics: dict):
        if push is not None and cfg.push_every and step % cfg.push_every == 0:
            view = pushable(drafter)  # FSDP2: every rank gathers, rank 0 gets the full drafter
            if rank == 0:
                push(step, view)
                pushed.append(step)

    summary = run_training(drafter, step_fn, run_dir, steps=cfg.steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                           min_lr_ratio=cfg.min_lr_ratio, grad_clip=cfg.grad_clip, seed=cfg.seed,
                           log_every=cfg.log_every, ckpt_every=cfg.ckpt_every, max_minutes=cfg.max_minutes,
                           config=cfg.model_dump(), desc="SpecOPD", on_step=on_step, progress=progress,
                           batch_steps=cfg.minibatches)
    if rank == 0 and push is not None and (not pushed or pushed[-1] != summary["steps"]):
        push(summary["steps"], drafter)
        pushed.append(summary["steps"])
    summary.update(supervised_tokens=counters.tokens, supervised_tokens_per_s=counters.tokens / max(counters.wall(),
                   1e-9), start_step=counters.start_step, pushed=pushed)
    return summary
