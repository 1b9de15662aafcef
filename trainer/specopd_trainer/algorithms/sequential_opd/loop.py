"""Sequential-rollout OPD against a live server on the shared engine (single process).

Before every step the current drafter is pushed into the server, real draft-and-verify rollouts are generated
through it (on-policy), and their recorded blocks are scored and trained on (:func:`.rollouts.rollout_step`).
Metrics as SpecOPD's (:mod:`specopd_trainer.loops.counters`), plus ``rollout_tokens`` and ``records``.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import torch

from specopd_trainer.algorithms.registry import PushFn, ShardingRefusedError
from specopd_trainer.algorithms.sequential_opd.config import SequentialOPDConfig
from specopd_trainer.algorithms.sequential_opd.rollouts import collect_rollouts, rollout_step
from specopd_trainer.loops.common import dist_info
from specopd_trainer.loops.counters import Counters, passthrough
from specopd_trainer.loops.engine import run_training


def train_sequential_opd(drafter, client, prompts: List[List[int]], run_dir: str | Path, cfg: SequentialOPDConfig,
                         *, push: PushFn, progress: bool = True) -> dict:
    """Sequential-rollout OPD: per step push the drafter (``push(step, drafter)``, so the rollouts are
    on-policy), roll out ``cfg.rollout_prompts`` random ``prompts`` (token-id lists) through the server with
    acceptance traces, train on the recorded blocks (:func:`rollout_step`, E2E-TV); push once more at the end.

    Single process (the rollouts must come from the drafter rank 0 pushes). Returns the engine summary plus
    ``supervised_tokens``, ``supervised_tokens_per_s``, ``start_step`` and ``pushed``. Raises
    :class:`ShardingRefusedError` under ``torchrun`` and ValueError without prompts.
    """
    rank, world = dist_info()
    if world > 1:
        raise ShardingRefusedError("sequential OPD runs in a single process (its rollouts come from the pushed "
                                   "drafter): not under torchrun")
    if not prompts:
        raise ValueError("no prompts")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    layer_ids = list(drafter.spec.target_layer_ids)
    counters = Counters(run_dir, cfg.ckpt_every, rank)
    pushed: List[int] = []

    def step_fn(step: int, gen: torch.Generator):
        push(step, drafter)
        pushed.append(step)
        idx = torch.randint(len(prompts), (cfg.rollout_prompts,), generator=gen).tolist()
        rollouts = collect_rollouts(client, [prompts[i] for i in idx], max_new_tokens=cfg.rollout_tokens,
                                    temperature=cfg.temperature, concurrency=cfg.concurrency)
        loss, m = rollout_step(drafter, client, rollouts, layer_ids)
        loss.backward()
        tokens = int(m["supervised_tokens"])
        out = passthrough(m, {"supervised_tokens"})
        out["rollout_tokens"] = sum(len(r.token_ids) - r.prompt_len for r in rollouts)
        out["step_supervised_tokens"] = tokens
        out.update(counters.add(step + 1, tokens))
        return float(loss.item()), out

    summary = run_training(drafter, step_fn, run_dir, steps=cfg.steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                           min_lr_ratio=cfg.min_lr_ratio, grad_clip=cfg.grad_clip, seed=cfg.seed,
                           log_every=cfg.log_every, ckpt_every=cfg.ckpt_every, max_minutes=cfg.max_minutes,
                           config=cfg.model_dump(), desc="sequential OPD", progress=progress)
    push(summary["steps"], drafter)
    pushed.append(summary["steps"])
    summary.update(supervised_tokens=counters.tokens, supervised_tokens_per_s=counters.tokens / max(counters.wall(),
                   1e-9), start_step=counters.start_step, pushed=pushed)
    return summary
