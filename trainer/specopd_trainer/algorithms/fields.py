"""Config fields every training algorithm shares (optimiser, schedule, budget, logging), one factory each, so that
their constraints and descriptions (the CLI help) are written once. Defaults differ per algorithm."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


def steps(default: int) -> Any:
    """``steps``: total optimiser steps."""
    return Field(default=default, ge=1, description="Total optimiser steps (a resumed run continues to it).")


def max_minutes() -> Any:
    """``max_minutes``: training-time budget (None: steps only)."""
    return Field(default=None, gt=0, description="Stop after this much training time in minutes, resumes included "
                                                 "(resumable; default: no time budget).")


def lr(default: float) -> Any:
    """``lr``: peak learning rate."""
    return Field(default=default, gt=0, description="Peak learning rate (AdamW).")


def warmup_steps(default: int) -> Any:
    """``warmup_steps``: linear warmup, then cosine decay."""
    return Field(default=default, ge=0, description="Warmup steps (then cosine decay).")


def min_lr_ratio() -> Any:
    """``min_lr_ratio``: the cosine decay's floor as a fraction of the peak."""
    return Field(default=0.1, ge=0, le=1, description="Final learning rate as a fraction of the peak.")


def grad_clip() -> Any:
    """``grad_clip``: gradient-norm clip."""
    return Field(default=1.0, gt=0, description="Gradient-norm clip.")


def seed() -> Any:
    """``seed``: seed of the per-step RNG."""
    return Field(default=0, description="Seed of the per-step RNG (anchors, branches, sequences).")


def log_every(default: int) -> Any:
    """``log_every``: metrics.jsonl row every N steps."""
    return Field(default=default, ge=1, description="metrics.jsonl row every N steps.")


def ckpt_every(default: int) -> Any:
    """``ckpt_every``: atomic checkpoint every N steps."""
    return Field(default=default, ge=1, description="Atomic checkpoint every N steps.")


def parallel() -> Any:
    """``parallel``: how the ranks share a step under ``torchrun`` (ddp or fsdp2)."""
    return Field(default="ddp", description="How ranks share the work under torchrun (no effect in a single "
                 "process): ddp (every rank holds the whole drafter and optimizer, gradients all-reduced, "
                 "seqs_per_step counts per rank) or fsdp2 (torch FSDP2 fully_shard: parameters, gradients and AdamW "
                 "state sharded across ranks; each step's global batch, the single-process one, is split across "
                 "ranks). Checkpoints are full either way: a run resumes under either strategy or in one process")


class TrainConfig(BaseModel):
    """Base of every algorithm's config: strict (unknown keys rejected), frozen, and the fields whose default is the
    same for every algorithm (time budget, LR floor, gradient clip, seed); subclasses add the rest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_minutes: Optional[float] = max_minutes()
    min_lr_ratio: float = min_lr_ratio()
    grad_clip: float = grad_clip()
    seed: int = seed()
    parallel: Literal["ddp", "fsdp2"] = parallel()
