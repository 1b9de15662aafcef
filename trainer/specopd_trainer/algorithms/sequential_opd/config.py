"""Sequential-rollout OPD hyper-parameters (strict pydantic; no torch at import)."""

from __future__ import annotations

from pydantic import Field, model_validator

from specopd_trainer.algorithms import fields as f


class SequentialOPDConfig(f.TrainConfig):
    """Sequential-rollout OPD hyper-parameters (strict: unknown keys rejected)."""

    steps: int = f.steps(50)
    rollout_prompts: int = Field(default=8, ge=1, description="Prompts rolled out per step.")
    rollout_tokens: int = Field(default=64, ge=2, description="New tokens per rollout.")
    temperature: float = Field(default=1.0, ge=0, description="Rollout sampling temperature (0 = greedy).")
    concurrency: int = Field(default=8, ge=1, description="Rollout requests in flight.")
    lr: float = f.lr(3e-4)
    warmup_steps: int = f.warmup_steps(2)
    log_every: int = f.log_every(1)
    ckpt_every: int = f.ckpt_every(25)

    @model_validator(mode="after")
    def _single_process(self):
        if self.parallel == "fsdp2":
            raise ValueError("sequential OPD cannot run sharded (fsdp2): it pushes the drafter and rolls out through "
                             "the server before every step, in a single process")
        return self
