"""SFT hyper-parameters (strict pydantic; no torch import, so the CLI can list it cheaply)."""

from __future__ import annotations

from pydantic import Field

from specopd_trainer.algorithms import fields as f


class SFTConfig(f.TrainConfig):
    """SFT hyper-parameters (strict: unknown keys rejected)."""

    steps: int = f.steps(1000)
    seqs_per_step: int = Field(default=8, ge=1, description="Sequences per step (per rank under ddp; under fsdp2 the "
                                                                 "global batch, split across ranks).")
    anchors_per_seq: int = Field(default=16, ge=1, description="Anchors per sequence.")
    lr: float = f.lr(1e-3)
    warmup_steps: int = f.warmup_steps(30)
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    gamma_decay: float = Field(default=5.0, gt=0, description="Slot decay of the ce_decay loss: slot k weighs "
                                                                "exp(-(k-1)/gamma).")
    log_every: int = f.log_every(10)
    ckpt_every: int = f.ckpt_every(50)
    eval_every: int = Field(default=100, ge=1, description="Held-out greedy-walk tau every N steps.")
    eval_sequences: int = Field(default=12, ge=1, description="Held-out sequences of that evaluation.")
