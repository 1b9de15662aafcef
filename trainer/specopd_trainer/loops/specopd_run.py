"""Whole training runs against a live server: SpecOPD (branch-parallel) and sequential-rollout OPD.

:func:`train_specopd` drives :func:`specopd_trainer.loops.specopd.specopd_step` (drafter forward at anchors,
K branches sampled from the drafter, ONE ``/specopd/score_trees`` call per step, loss from the registry) on the
shared engine (:func:`specopd_trainer.loops.engine.run_training`: AdamW, warmup + cosine, atomic checkpoints,
exact resume from the run directory). Under ``torchrun`` the step is wrapped in DistributedDataParallel (gloo on
CPU) exactly like :func:`specopd_trainer.loops.sft.train_sft`: each rank samples its own sequences with its
per-rank step generator and scores them with its own server call; the backward all-reduces; only rank 0 logs,
checkpoints and pushes.

:func:`train_sequential_opd` is the baseline: before every step the current drafter is pushed into the server,
real draft-and-verify rollouts are generated through it (on-policy), and their recorded blocks are scored
(:func:`specopd_trainer.loops.sequential_opd.rollout_step`). Single process.

Metrics (one ``metrics.jsonl`` row per logged step, besides the engine's step/loss/lr/grad_norm/wall_s):
``est_tau``, ``alpha`` (per slot), ``step_supervised_tokens`` (this step, summed over ranks),
``supervised_tokens`` (cumulative over the whole run, resumes included), ``supervised_wall_s`` (cumulative
training wall seconds, resumes included), ``supervised_tokens_per_s`` (their ratio), and every
other int/float metric the step returns.
The cumulative counters survive a resume through ``counters.json`` (keyed by checkpoint step).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

from specopd_trainer.loops.common import dist_info
from specopd_trainer.loops.engine import run_training

PushFn = Callable[[int, object], object]

COUNTERS_FILE = "counters.json"


class _Counters:
    """Cumulative supervised tokens and training wall time, persisted per step so that a resume continues them.

    ``counters.json`` maps a step (completed steps) to {supervised_tokens, wall_s}; it is written atomically by
    rank 0 at the end of each step function, i.e. before the engine checkpoints that step, and keeps the steps
    of the last ``3 * ckpt_every + batch_steps`` (the latest checkpoint is among them: the engine checkpoints at
    least every ``ckpt_every + batch_steps - 1`` steps).
    """

    def __init__(self, run_dir: Path, ckpt_every: int, rank: int, batch_steps: int = 1):
        from specopd_trainer.checkpoint import latest_checkpoint

        self.path = run_dir / COUNTERS_FILE
        self.window = 3 * ckpt_every + batch_steps
        self.rank = rank
        self.table: Dict[str, dict] = {}
        if self.path.is_file():
            self.table = json.loads(self.path.read_text())
        ckpt = latest_checkpoint(run_dir)
        self.start_step = int(ckpt.stem.split("-")[-1]) if ckpt is not None else 0
        row = self.table.get(str(self.start_step), {}) if self.start_step else {}
        self.tokens = int(row.get("supervised_tokens", 0))
        self.wall_before = float(row.get("wall_s", 0.0))
        self.t0 = time.monotonic()
        if rank == 0 and self.start_step:
            _truncate_metrics(run_dir / "metrics.jsonl", self.start_step)

    def wall(self) -> float:
        return self.wall_before + time.monotonic() - self.t0

    def add(self, done_steps: int, tokens: int) -> Dict[str, float]:
        self.tokens += int(tokens)
        wall = self.wall()
        if self.rank == 0:
            self.table[str(done_steps)] = {"supervised_tokens": self.tokens, "wall_s": round(wall, 3)}
            keys = sorted(int(k) for k in self.table)
            self.table = {str(k): self.table[str(k)] for k in keys if k >= keys[-1] - self.window}
            _atomic_write_text(self.path, json.dumps(self.table))
        return {"supervised_tokens": self.tokens, "supervised_wall_s": wall,
                "supervised_tokens_per_s": self.tokens / max(wall, 1e-9)}


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metrics rows past the checkpoint a run resumes from (written after it, before a crash)."""
    if not path.is_file():
        return
    lines = [l for l in path.read_text().splitlines() if l.strip()]
    keep = [l for l in lines if json.loads(l).get("step", 0) <= step]
    if len(keep) != len(lines):
        _atomic_write_text(path, "".join(l + "\n" for l in keep))


def _passthrough(metrics: dict, handled) -> dict:
    return {k: v for k, v in metrics.items()
            if k not in handled and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _reduce(loss: float, tau: float, alpha: List[float], tokens: int, world: int):
    """Across ranks: mean loss, est_tau and alpha; summed supervised tokens."""
    import torch.distributed as dist

    t = torch.tensor([loss, tau, float(tokens), *alpha], dtype=torch.float64)
    dist.all_reduce(t)
    v = t.tolist()
    return v[0] / world, v[1] / world, [a / world for a in v[3:]], int(round(v[2]))


class _SpecOPDStep(torch.nn.Module):
    """The DDP-wrappable unit: one minibatch's loss (:mod:`specopd_trainer.loops.specopd_batch`); minibatch 0
    first samples and scores the batch (drafter forward, sampling, ONE server call) and keeps it for the others."""

    def __init__(self, drafter, client, cfg):
        super().__init__()
        self.drafter = drafter
        self._client = client
        self._cfg = cfg
        self.batch = None

    def forward(self, seqs, gen, part: int):
        from specopd_trainer.loops.specopd_batch import minibatch_loss, sample_and_score

        if part == 0:
            self.batch = None  # free the previous batch's rows first
            self.batch = sample_and_score(self.drafter, self._client, seqs, self._cfg, gen)
        return minibatch_loss(self.drafter, self.batch, part, self._cfg)


def train_specopd(drafter, client, train_seqs: List, run_dir: str | Path, cfg, *, push: Optional[PushFn] = None,
                  progress: bool = True) -> dict:
    """Train ``drafter`` in place with SpecOPD against the server behind ``client``; resumes from ``run_dir``.

    Args:
        train_seqs: :class:`specopd_trainer.features.Sequence` list (reference responses with context features).
        cfg: :class:`specopd_trainer.loops.specopd.SpecOPDConfig`.
        push: ``push(step, drafter)``, called on rank 0 every ``cfg.push_every`` steps (0: never during the
            run) and once at the end (unless the last step was just pushed).

    Returns the engine summary plus ``supervised_tokens``, ``supervised_tokens_per_s`` (cumulative over the
    run's resumes), ``start_step`` and ``pushed`` (the steps pushed by this call).
    """
    if not train_seqs:
        raise ValueError("no training sequences")
    rank, world = dist_info()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    module = _SpecOPDStep(drafter, client, cfg)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        # the target head's (non-persistent) buffers are loaded identically on every rank: no per-step broadcast
        module = DistributedDataParallel(module, broadcast_buffers=False)
    counters = _Counters(run_dir, cfg.ckpt_every, rank, cfg.minibatches)
    pushed: List[int] = []
    batch_start = [None]  # the step whose generator sampled the scored batch in use

    def step_fn(step: int, gen: torch.Generator):
        if batch_start[0] is None or step - batch_start[0] >= cfg.minibatches:
            batch_start[0] = step
        part = step - batch_start[0]
        seqs = []
        if part == 0:
            picks = torch.randint(len(train_seqs), (cfg.seqs_per_step,), generator=gen).tolist()
            seqs = [train_seqs[i] for i in picks]
        loss, m = module(seqs, gen, part)
        loss.backward()
        value, tau = float(loss.item()), float(m["est_tau"])
        alpha, tokens = [float(a) for a in m["alpha"]], int(m["supervised_tokens"])
        if world > 1:
            value, tau, alpha, tokens = _reduce(value, tau, alpha, tokens, world)
        out = _passthrough(m, {"alpha", "est_tau", "supervised_tokens"})
        out.update({"est_tau": tau, "alpha": alpha, "step_supervised_tokens": tokens})
        out.update(counters.add(step + 1, tokens))
        return value, out

    def on_step(step: int, metrics: dict):
        if rank == 0 and push is not None and cfg.push_every and step % cfg.push_every == 0:
            push(step, drafter)
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


class SequentialOPDConfig(BaseModel):
    """Sequential-rollout OPD hyper-parameters (strict: unknown keys rejected)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=50, ge=1)
    max_minutes: Optional[float] = Field(default=None, gt=0)
    rollout_prompts: int = Field(default=8, ge=1, description="prompts rolled out per step")
    rollout_tokens: int = Field(default=64, ge=2, description="new tokens per rollout")
    temperature: float = Field(default=1.0, ge=0, description="rollout sampling temperature (0 = greedy)")
    concurrency: int = Field(default=8, ge=1, description="rollout requests in flight")
    lr: float = Field(default=3e-4, gt=0)
    warmup_steps: int = Field(default=2, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    grad_clip: float = Field(default=1.0, gt=0)
    seed: int = 0
    log_every: int = Field(default=1, ge=1)
    ckpt_every: int = Field(default=25, ge=1)


def train_sequential_opd(drafter, client, prompts: List[List[int]], run_dir: str | Path, cfg: SequentialOPDConfig,
                         *, push: PushFn, progress: bool = True) -> dict:
    """Sequential-rollout OPD: per step push the drafter (``push(step, drafter)``, so the rollouts are
    on-policy), roll out ``cfg.rollout_prompts`` random ``prompts`` (token-id lists) through the server with
    acceptance traces, train on the recorded blocks (:func:`rollout_step`, E2E-TV); push once more at the end.

    Single process (the rollouts must come from the drafter rank 0 pushes). Returns the engine summary plus
    ``supervised_tokens``, ``supervised_tokens_per_s``, ``start_step`` and ``pushed``.
    """
    from specopd_trainer.loops.sequential_opd import collect_rollouts, rollout_step

    rank, world = dist_info()
    if world > 1:
        raise ValueError("sequential OPD runs in a single process (its rollouts come from the pushed drafter)")
    if not prompts:
        raise ValueError("no prompts")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    layer_ids = list(drafter.spec.target_layer_ids)
    counters = _Counters(run_dir, cfg.ckpt_every, rank)
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
        out = _passthrough(m, {"supervised_tokens"})
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
