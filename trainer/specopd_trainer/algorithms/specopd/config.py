"""SpecOPD hyper-parameters (strict pydantic; no torch at import, so the CLI can list them cheaply)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from specopd_trainer.algorithms import fields as f


class SpecOPDConfig(f.TrainConfig):
    """SpecOPD hyper-parameters (strict: unknown keys rejected). The defaults are the library's; the validated recipe
    (``specopd train specopd``'s defaults, the main job) is the registry entry's ``recipe``."""

    steps: int = f.steps(200)
    seqs_per_step: int = Field(default=2, ge=1, description="Reference sequences per step (per rank under ddp; under "
                                                             "fsdp2 the global batch, split across ranks).")
    anchors_per_seq: int = Field(default=32, ge=1, description="Branch anchors per sequence.")
    branches: int = Field(default=8, ge=1, description="Branches sampled from the drafter per anchor.")
    temperature: float = Field(default=1.0, gt=0, description="Branch sampling temperature (> 0).")
    greedy_branch: bool = Field(
        default=False, description="branch 0 of every anchor is the argmax block (what SGLang's DFLASH worker "
                                   "proposes at every temperature); the other branches are sampled")
    loss: str = Field(default="e2e_tv", description="Proposal-tree loss of the loss registry: e2e_tv (the paper's), "
                      "e2e_fkl, e2e_fkl_is (E2E-KL with accepted-prefix weights), tv, fkl, rkl, e2e_tv_fused. Any name "
                      "of specopd_kernels.losses.tree_losses() is accepted.")
    reference_branch: float = Field(
        default=0.0, ge=0, lt=1,
        description="lambda of the T=0 term (loss e2e_fkl_is only; 0 = off): the reference continuation, the "
                    "target's greedy path and so the states a T=0 served DFlash block visits, is one more branch "
                    "per anchor, weighted by the drafter's T=0 acceptance along it; the loss is (1 - lambda) x the "
                    "sampled branches' + lambda x the reference branches'. Its tokens count as supervised")
    root_anchors_per_seq: int = Field(
        default=0, ge=0,
        description="extra anchors per sequence scored at the tree root only (loss e2e_fkl / e2e_fkl_is): slot 1 "
                    "is conditioned on the reference prefix alone, the same for every branch, and its target row "
                    "is a prefix row the tree forward computes anyway, so the slot-1 term of the loss is "
                    "estimated over all anchors and slots 2..G over the branch anchors. 1 supervised token each")
    minibatches: int = Field(
        default=1, ge=1,
        description="optimizer steps per scored batch: each sequence gets minibatches x anchors_per_seq branch "
                    "anchors, all branches are sampled and scored in one server call (the target computes each "
                    "reference prefix once), then every optimizer step trains with the current drafter on one "
                    "disjoint share of anchors_per_seq branch anchors per sequence plus root_anchors_per_seq root "
                    "anchors drawn for that share (prefix rows: free to score)")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="torch.autocast dtype of the drafter forward (weights and optimizer stay "
                                       "fp32; the loss runs in fp32). bfloat16 halves the drafter's CPU time (AMX) "
                                       "but measured 1.400 / 1.300 vs 1.420 / 1.310 mean tau (T0 / T1) on validation")
    lr: float = f.lr(3e-4)
    warmup_steps: int = f.warmup_steps(10)
    log_every: int = f.log_every(5)
    ckpt_every: int = f.ckpt_every(25)
    push_every: int = Field(default=0, ge=0, description="Push the drafter into the server every N steps (0: only "
                                                          "at the end).")
    head_dtype: Literal["float32", "bfloat16"] = Field(
        default="bfloat16", description="dtype of the frozen target LM-head matmul giving p (SGLang serves bf16)")

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        from specopd_kernels.losses import tree_losses

        if v not in tree_losses():
            raise ValueError(f"unknown SpecOPD loss {v!r}; valid: {', '.join(tree_losses())}")
        return v

    @model_validator(mode="after")
    def _reference_branch_loss(self):
        from specopd_kernels.losses import LOSSES, root_anchor_losses

        if self.reference_branch > 0 and not LOSSES[self.loss].greedy_branches:
            with_term = " or ".join(n for n, s in LOSSES.items() if s.greedy_branches)
            raise ValueError(f"reference_branch > 0 needs loss {with_term}, got {self.loss!r}")
        if self.root_anchors_per_seq > 0:
            if self.loss not in root_anchor_losses():
                raise ValueError(f"root_anchors_per_seq > 0 needs loss {' or '.join(root_anchor_losses())}, got "
                                 f"{self.loss!r}")
        if self.root_anchors_per_seq > 0 and self.reference_branch > 0:
            raise ValueError("root_anchors_per_seq and reference_branch cannot be combined")
        return self

    @property
    def branches_per_anchor(self) -> int:
        """Branches the loss trains on per anchor: the sampled ones plus the reference branch when it is on."""
        return self.branches + (1 if self.reference_branch > 0 else 0)
