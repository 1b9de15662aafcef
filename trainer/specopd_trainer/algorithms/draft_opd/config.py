"""Draft-OPD hyper-parameters (strict pydantic; no torch at import)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from specopd_trainer.algorithms import fields as f


class DraftOPDConfig(f.TrainConfig):
    """Draft-OPD hyper-parameters (strict: unknown keys rejected). Defaults: the paper's objective (gamma 0.8,
    lambda_acc = lambda_rej = 1, error anchors, replay on)."""

    steps: int = f.steps(50)
    rollout_prompts: int = Field(default=8, ge=1, description="Prompts rolled out per step (all in flight at once, "
                                                               "up to --concurrency).")
    rollout_tokens: int = Field(default=64, ge=2, description="New tokens per rollout.")
    temperature: float = Field(default=1.0, ge=0, description="Rollout sampling temperature (0 = greedy; > 0 samples "
                                                              "the drafts and verifies losslessly).")
    concurrency: int = Field(default=8, ge=1, description="Rollout requests in flight.")
    anchors: Literal["error", "random"] = Field(
        default="error", description="Which recorded blocks are replayed: error (blocks with a rejected slot, the "
                                     "paper's) or random (the ablation: as many blocks as there are error blocks, "
                                     "drawn uniformly from all recorded blocks, with or without a rejection)")
    max_blocks: int = Field(default=256, ge=1, description="Most replayed blocks per step (a random subset beyond).")
    loss: Literal["mixed", "fkl_only", "rkl_only"] = Field(
        default="mixed", description="mixed: forward KL on accepted slots, reverse KL on rejected ones (the "
                                     "paper's); fkl_only / rkl_only: one direction on both (the ablations)")
    rejected_slots: Literal["all", "first"] = Field(
        default="all", description="Rejected slots the reverse-KL term covers: all (the first rejected slot and every "
                                   "slot after it, the paper's) or first (only the first rejected one: a DFlash "
                                   "drafter predicts every slot from the anchor alone, so after a rejection the "
                                   "target's p conditions on drafted tokens the drafter never serves from)")
    gamma: float = Field(default=0.8, gt=0, le=1, description="Rejected slot k weighs gamma^(k-1).")
    lambda_acc: float = Field(default=1.0, ge=0, description="Weight of the accepted-slot term.")
    lambda_rej: float = Field(default=1.0, ge=0, description="Weight of the rejected-slot term.")
    replay: bool = Field(default=True, description="Replay the drafter at the selected anchors and distil (the "
                                                   "method); --no-replay: ce_decay SFT on the rollout text at those "
                                                   "anchors instead (the paper's no-replay ablation)")
    sft_gamma_decay: float = Field(default=5.0, gt=0, description="ce_decay slot decay of --no-replay.")
    max_staleness: Optional[int] = Field(
        default=1, ge=0, description="Drop verify records proposed by a drafter more than this many pushes older "
                                     "than the serving one (default 1; unset: keep every record). Records whose "
                                     "version is unknown to the run are dropped too, unless --keep-unknown-versions")
    keep_unknown_versions: bool = Field(default=False, description="Keep records whose drafter version the run does "
                                                                   "not know (no version, or not pushed by this run).")
    from_traffic: bool = Field(default=False, description="Train on the traffic the server recorded (its admin "
                                                          "traffic endpoint) instead of rolling out prompts.")
    traffic_items: int = Field(default=64, ge=1, le=4096, description="Most traffic items read per step "
                                                                      "(--from-traffic).")
    purge_traffic: bool = Field(default=False, description="Purge the server's traffic after each read "
                                                           "(--from-traffic; the client's cursor already returns "
                                                           "every item once, so this only bounds the spool).")
    traffic_wait_s: float = Field(default=600.0, gt=0, description="Wait at most this long for usable traffic "
                                                                   "per step (--from-traffic).")
    lr: float = f.lr(3e-4)
    warmup_steps: int = f.warmup_steps(2)
    log_every: int = f.log_every(1)
    ckpt_every: int = f.ckpt_every(25)
    push_every: int = Field(default=1, ge=0, description="Push the drafter into the server every N steps, before "
                                                         "that step's rollouts (0: only at the end).")
    head_dtype: Literal["float32", "bfloat16"] = Field(
        default="bfloat16", description="dtype of the frozen target LM-head matmul giving p (SGLang serves bf16)")
