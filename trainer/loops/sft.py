"""SFT of a DFlash drafter on target responses (the offline baseline SpecOPD starts from).

Per step: ``seqs_per_step`` sequences, ``anchors_per_seq`` random anchors each (response positions), one drafter
forward per sequence with the anchor-block training mask, loss ``ce_decay`` (DFlash: w_k = exp(-(k-1)/gamma) over
slots k = 1..B-1), AdamW with linear warmup + cosine decay, gradient clipping. Checkpoints are atomic and resume
is exact (each step's sampling RNG is a pure function of (seed, step, rank)). Under ``torchrun`` the loss module
is wrapped in DDP (gloo on CPU) and each rank samples its own sequences. Metrics go to ``<run>/metrics.csv``.
"""

from __future__ import annotations

import contextlib
import csv
import time
from pathlib import Path
from typing import List, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

from specopd_trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from specopd_trainer.loops.common import dist_info, lr_at, mean_walk_tau, sample_anchors, step_generator


class SFTConfig(BaseModel):
    """SFT hyper-parameters (strict: unknown keys rejected)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=1000, ge=1)
    max_minutes: Optional[float] = Field(default=None, gt=0)
    seqs_per_step: int = Field(default=8, ge=1)
    anchors_per_seq: int = Field(default=16, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    warmup_steps: int = Field(default=30, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    gamma_decay: float = Field(default=5.0, gt=0)
    seed: int = 0
    log_every: int = Field(default=10, ge=1)
    ckpt_every: int = Field(default=50, ge=1)
    eval_every: int = Field(default=100, ge=1)
    eval_sequences: int = Field(default=12, ge=1)


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


def train_sft(drafter, train_seqs: List, eval_seqs: List, run_dir: str | Path, cfg: SFTConfig,
              progress: bool = True) -> dict:
    """Train ``drafter`` in place; resume from ``run_dir`` if it holds a checkpoint. Returns a summary dict.

    ``train_seqs`` / ``eval_seqs``: :class:`specopd_trainer.features.Sequence` lists (features [L, K*H]).
    """
    rank, world = dist_info()
    run_dir = Path(run_dir)
    module = DrafterLoss(drafter, cfg.gamma_decay)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        module = DistributedDataParallel(module)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    start, wall_before = 0, 0.0
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt)
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        start, wall_before = int(state["step"]), float(state.get("wall_s", 0.0))
    metrics_path = run_dir / "metrics.csv"
    run_dir.mkdir(parents=True, exist_ok=True)
    new_file = not metrics_path.exists()
    fh = open(metrics_path, "a", newline="")
    log = csv.writer(fh)
    if new_file and rank == 0:
        log.writerow(["step", "loss", "lr", "tokens", "tokens_per_s", "wall_s", "eval_walk_tau"])
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="SFT", dynamic_ncols=True)
    t0 = time.monotonic()
    step, last_loss, tokens_seen = start, float("nan"), 0
    eval_tau = float("nan")
    while step < cfg.steps:
        if cfg.max_minutes is not None and wall_before + time.monotonic() - t0 > cfg.max_minutes * 60:
            break
        gen = step_generator(cfg.seed, step, rank)
        picks = torch.randint(len(train_seqs), (cfg.seqs_per_step,), generator=gen)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, base_lr=cfg.lr, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps,
                            min_ratio=cfg.min_lr_ratio)
        opt.zero_grad(set_to_none=True)
        total, n_blocks = 0.0, 0
        work = []
        for i in picks.tolist():
            s = train_seqs[i]
            anchors = sample_anchors(s.prompt_len, len(s.token_ids), cfg.anchors_per_seq, gen)
            if anchors.numel():
                work.append((s, anchors))
        for j, (s, anchors) in enumerate(work):
            # Gradient accumulation: under DDP only the last backward of the step all-reduces.
            sync = world == 1 or j == len(work) - 1
            with (contextlib.nullcontext() if sync else module.no_sync()):
                loss = module(s.features.float(), s.token_ids, anchors) / cfg.seqs_per_step
                loss.backward()
            total += float(loss) * cfg.seqs_per_step
            n_blocks += int(anchors.numel())
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        last_loss = total / cfg.seqs_per_step
        tokens_seen += n_blocks * (drafter.block_size - 1)
        wall = wall_before + time.monotonic() - t0
        if rank == 0 and step % cfg.eval_every == 0 and eval_seqs:
            eval_tau = mean_walk_tau(drafter, eval_seqs, cfg.eval_sequences)
        if rank == 0 and (step % cfg.log_every == 0 or step == cfg.steps):
            log.writerow([step, f"{last_loss:.5f}", f"{opt.param_groups[0]['lr']:.3e}", tokens_seen,
                          f"{tokens_seen / max(1e-9, time.monotonic() - t0):.1f}", f"{wall:.1f}", f"{eval_tau:.4f}"])
            fh.flush()
        if rank == 0 and step % cfg.ckpt_every == 0:
            save_checkpoint(run_dir, step, {"drafter": drafter.state_dict(), "optimizer": opt.state_dict(),
                                            "config": cfg.model_dump(), "wall_s": wall})
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{last_loss:.3f}", tau=f"{eval_tau:.2f}")
    wall = wall_before + time.monotonic() - t0
    if rank == 0 and step > start:
        save_checkpoint(run_dir, step, {"drafter": drafter.state_dict(), "optimizer": opt.state_dict(),
                                        "config": cfg.model_dump(), "wall_s": wall})
    if bar is not None:
        bar.close()
    fh.close()
    return {"steps": step, "loss": last_loss, "wall_s": wall, "train_tokens_this_run": tokens_seen}
