"""``specopd adapt`` settings (strict pydantic, frozen; no torch import so the CLI can list them cheaply)."""

from __future__ import annotations

from typing import Dict, Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field


class AdaptConfig(BaseModel):
    """Settings of one adaptation run. Every field is a ``specopd adapt`` option (``--field-name``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str = Field(default="auto", description="registered training algorithm the candidate learns with "
                                                       "(one with an adapt step: sft, specopd, draft-opd), or auto: "
                                                       "sft until the held-out gain flattens, then the algorithm "
                                                       "adapt/auto.py's table names for the serving temperature and "
                                                       "the drafter (sft where no OPD win is measured)")
    algorithm_options: Dict[str, object] = Field(
        default_factory=dict, description="overrides of that algorithm's config fields (CLI: --set key=value)")
    serving_temperature: float = Field(default=0.0, ge=0, description="auto: the temperature the server's users "
                                                                      "sample at (0: greedy), for the table")
    auto_flat_verdicts: int = Field(default=3, ge=1, description="auto: SFT has flattened when the last K candidate "
                                                                 "verdicts all gained less than auto_flat_gain")
    auto_flat_gain: float = Field(default=0.02, description="auto: the held-out greedy-walk tau gain (candidate - "
                                                            "deployed) below which a verdict counts as flat")
    auto_options: Dict[str, Dict[str, object]] = Field(
        default_factory=dict, description="auto: per algorithm, overrides of its config for the phase after SFT")
    holdout_every: int = Field(default=4, ge=2, description="~1/k of the distinct prompts (a hash of the prompt's "
                                                            "ids divisible by k) are held out: never trained on, "
                                                            "used to judge candidates")
    min_holdout: int = Field(default=12, ge=2, description="held-out requests needed before a candidate is judged")
    holdout_window: int = Field(default=48, ge=2, description="judge on the newest N held-out requests")
    holdout_per_slice: int = Field(default=32, ge=2, description="held-out requests kept per slice of the traffic "
                                                                 "(oldest of that slice dropped): old slices keep "
                                                                 "their held-out size after a shift")
    slice_prefix_tokens: int = Field(default=4, ge=1, description="a slice is a hash of the prompt's first K tokens "
                                                                  "after the chat template's header")
    slice_header: Tuple[int, ...] = Field(default=(), description="the chat template's fixed header (token ids); "
                                                                  "empty: the majority prefix of the first page read")
    slice_min_seen: int = Field(default=4, ge=1, description="a prefix becomes its own slice once seen this often "
                                                             "(before: the shared slice 'other')")
    max_slices: int = Field(default=32, ge=1, description="at most this many slices (the rest: 'other')")
    holdout_older: int = Field(default=48, ge=0, description="also on up to N older held-out requests, spread over "
                                                             "the run: a candidate measured worse there (interval "
                                                             "below 0) is not deployed (0: newest only)")
    min_train_tokens: int = Field(default=256, ge=1, description="served response tokens in the training buffer "
                                                                 "before training starts")
    eval_every: int = Field(default=50, ge=1, description="judge the candidate every N optimiser steps")
    deploy_rule: Literal["ci", "mean"] = Field(
        default="ci", description="ci: push only when the paired 95% interval of (candidate - deployed) held-out "
                                  "tau lies above min_gain; mean: when the mean difference does")
    guard_min_slice_items: int = Field(default=8, ge=2, description="a slice with at least this many held-out "
                                                                     "requests is judged on its own (fewer: "
                                                                     "reported as not judged)")
    guard_margin: float = Field(default=0.02, ge=0, description="non-inferiority margin (tau) per slice: the "
                                                                "candidate's paired 95% lower bound of (candidate "
                                                                "- deployed) must be above -margin")
    min_gain: float = Field(default=0.0, ge=0, description="the tau gain (tokens per verify) the rule must clear")
    rollback: bool = Field(default=True, description="push the previous drafter back when the deployed one measures "
                                                     "worse than it on the held-out slice (interval below 0)")
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate (after a linear warmup)")
    retain: float = Field(default=0.5, ge=0, le=1, description="fraction of each SFT step's requests trained to keep "
                                                                "the start drafter's predictions where it proposed the "
                                                                "served token (not forgetting what it served well; 0 = "
                                                                "off)")
    rehearsal: float = Field(default=0.25, ge=0, le=0.9, description="share of every training step's requests "
                                                                     "drawn from the rehearsal buffer (older traffic, "
                                                                     "evenly over its slices), every algorithm")
    rehearsal_per_slice: int = Field(default=64, ge=1, description="rehearsal requests kept per slice (newest)")
    warmup_steps: int = Field(default=10, ge=0, description="linear LR warmup steps")
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    train_buffer_mb: float = Field(default=256.0, gt=0, description="MiB of training traffic (ids + features) kept "
                                                                    "in memory and on disk; oldest dropped")
    holdout_buffer_mb: float = Field(default=64.0, gt=0, description="MiB of held-out traffic kept (oldest dropped)")
    max_staleness: int = Field(default=2, ge=0, description="Draft-OPD: replay only records served by the deployed "
                                                            "drafter or the N before it")
    read_items: int = Field(default=64, ge=1, le=4096, description="spool items per read")
    start_at: Literal["oldest", "newest"] = Field(
        default="oldest", description="where a new run starts reading the spool: oldest (learn from what it holds) "
                                      "or newest (only traffic served from now on)")
    poll_s: float = Field(default=2.0, gt=0, description="wait between reads when the spool has nothing new")
    features: Literal["auto", "served", "score"] = Field(
        default="auto", description="context features: served (captured while serving; refuse a server that "
                                    "does not capture), score (score_trees second pass), auto (served when the "
                                    "server captures, else score)")
    max_item_tokens: int = Field(default=4096, ge=8, description="skip (count) served requests longer than this")
    ckpt_every: int = Field(default=50, ge=1, description="atomic checkpoint every N steps (and at every stop)")
    max_minutes: Optional[float] = Field(default=None, gt=0, description="stop after this many minutes of this "
                                                                          "process (default: run until stopped)")
    max_steps: Optional[int] = Field(default=None, ge=1, description="stop at this optimiser step (resumes count)")
    seed: int = 0
    log_every_s: float = Field(default=10.0, gt=0, description="progress line / metrics row period in seconds")
