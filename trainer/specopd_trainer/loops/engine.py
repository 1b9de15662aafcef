"""The training engine every loop shares: optimiser, LR schedule, time budget, metrics, checkpoints, resume.

A loop supplies ``step_fn(step, gen) -> (loss: float, metrics: dict)`` that runs forward AND backward for one
optimiser step (so it can accumulate over sequences, with DDP ``no_sync`` where needed); the engine zeroes
gradients, sets the LR (linear warmup + cosine), clips, steps AdamW, logs a CSV row every ``log_every`` steps,
writes an atomic checkpoint every ``ckpt_every`` steps and at the end, and resumes from the run directory's
latest checkpoint (the step RNG is a pure function of (seed, step, rank), so resume is exact). The progress bar
(:mod:`.progress`) runs over steps, or over training seconds when a time budget is set.

Under ``torchrun`` the loop wraps its loss module with :func:`specopd_trainer.loops.parallel.wrap` (DDP or FSDP2)
before calling :func:`run_training`; with FSDP2 the engine gathers full checkpoints (the single-process format,
collective), loads them into shards on resume, and returns the drafter with plain full parameters.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch

from specopd_trainer.checkpoint import (atomic_write_bytes, latest_checkpoint, load_checkpoint, save_checkpoint,
                                        truncate_metrics_log)
from specopd_trainer.loops.common import dist_info, lr_at, step_generator
from specopd_trainer.loops.parallel import full_training_state, grad_norm_value, load_training_state, materialize
from specopd_trainer.loops.progress import TrainProgress


def run_training(drafter, step_fn: Callable[[int, torch.Generator], Tuple[float, Dict]], run_dir: str | Path, *,
                 steps: int, lr: float, warmup_steps: int, min_lr_ratio: float, grad_clip: float, seed: int,
                 log_every: int, ckpt_every: int, max_minutes: Optional[float] = None, weight_decay: float = 0.0,
                 config: Optional[dict] = None, desc: str = "train",
                 on_step: Optional[Callable[[int, Dict], None]] = None, progress: bool = True,
                 schedule_steps: Optional[int] = None, batch_steps: int = 1) -> Dict:
    """Optimise ``drafter`` with ``step_fn``; returns {steps, loss, wall_s, metrics (last)}.

    ``schedule_steps``: the step count the LR schedule decays over (default ``steps``; past it the LR stays at
    ``min_lr_ratio * lr``), for loops that stop on another budget than a step count. ``batch_steps``: the loop's
    steps share state in groups of this many (e.g. one scored batch feeding several optimizer steps), so periodic
    checkpoints fall on the first group boundary at or after each multiple of ``ckpt_every`` and ``max_minutes``
    stops only at a boundary: a resume then starts a fresh group, exactly as the uninterrupted run did.
    """
    if batch_steps < 1:
        raise ValueError(f"batch_steps must be >= 1, got {batch_steps}")
    rank, _ = dist_info()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    start, wall_before = 0, 0.0
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt)
        load_training_state(drafter, opt, state["drafter"], state["optimizer"])
        start, wall_before = int(state["step"]), float(state.get("wall_s", 0.0))
    log_path = run_dir / "metrics.jsonl"
    if rank == 0:
        resume_metrics(run_dir, start)
    bar = TrainProgress(desc=desc, steps=steps, start_step=start, max_minutes=max_minutes, wall_before=wall_before,
                        enabled=progress and rank == 0)
    t0 = time.monotonic()
    step, loss, metrics = start, float("nan"), {}
    last_ckpt = start

    def checkpoint():
        nonlocal last_ckpt
        last_ckpt = step
        model_state, opt_state = full_training_state(drafter, opt)  # collective under FSDP2
        if rank == 0:
            save_checkpoint(run_dir, step, {"drafter": model_state, "optimizer": opt_state,
                                            "config": config or {}, "wall_s": wall_before + time.monotonic() - t0})

    while step < steps:
        if (max_minutes is not None and step % batch_steps == 0
                and wall_before + time.monotonic() - t0 > max_minutes * 60):
            break
        cur_lr = lr_at(step, base_lr=lr, warmup_steps=warmup_steps, total_steps=schedule_steps or steps,
                       min_ratio=min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        opt.zero_grad(set_to_none=True)
        loss, metrics = step_fn(step, step_generator(seed, step, rank))
        grad_norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(params, grad_clip))
        opt.step()
        step += 1
        wall = wall_before + time.monotonic() - t0
        if rank == 0 and (step % log_every == 0 or step == steps):
            row = {"step": step, "loss": loss, "lr": cur_lr, "grad_norm": grad_norm, "wall_s": round(wall, 2),
                   **metrics}
            with open(log_path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        if step % batch_steps == 0 and step // ckpt_every != last_ckpt // ckpt_every:
            checkpoint()
        if on_step is not None:
            on_step(step, metrics)
        bar.update(step, wall, {"loss": f"{loss:.4f}", **{k: f"{v:.3f}" for k, v in metrics.items()
                                                          if isinstance(v, float)}})
    if step > start and step != last_ckpt:
        checkpoint()
    materialize(drafter)  # FSDP2: plain full parameters again on every rank (final push, save_pretrained)
    bar.close()
    return {"steps": step, "loss": loss, "wall_s": wall_before + time.monotonic() - t0, "metrics": metrics}


def resume_metrics(run_dir: str | Path, step: int) -> None:
    """Before a run (re)starts at ``step`` (0: fresh): drop the metrics rows past it, so that every step keeps
    exactly one row in ``metrics.jsonl`` (rows logged after the latest checkpoint, before a crash, are logged again
    by the resumed run), and rewrite a ``metrics.csv`` left by an earlier call from the kept rows. Both files are
    replaced atomically."""
    run_dir = Path(run_dir)
    if truncate_metrics_log(run_dir / "metrics.jsonl", step) and (run_dir / "metrics.csv").is_file():
        write_metrics_csv(run_dir)


def write_metrics_csv(run_dir: str | Path) -> Path:
    """Flatten ``metrics.jsonl`` into ``metrics.csv`` (scalar columns) for spreadsheets and plots (atomic write)."""
    run_dir = Path(run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    keys = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float))})
    out = run_dir / "metrics.csv"
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    atomic_write_bytes(out, lambda fh: fh.write(text.getvalue().encode()))
    return out
