"""SpecOPD: branch-parallel on-policy distillation with the E2E-TV surrogate of acceptance length.

One step (SpecOPD paper; formulas in the shared algorithm notes):
1. drafter forward at ``anchors_per_seq`` reference anchors of each sequence (training mask, all anchors at once)
   -> per anchor the drafter's slot distributions q_1..q_G (G = block_size - 1; DFlash drafts every slot in
   parallel, so slot i's distribution does not depend on the sampled tokens of slots < i);
2. K branches per anchor sampled from q at ``temperature`` (no gradient), the drafter's own proposals; with
   ``greedy_branch`` branch 0 is the argmax block instead, the block the served DFLASH worker proposes;
3. ONE ``/specopd/score_trees`` call for the whole step: every branch of every anchor packed into proposal trees
   sharing the reference prefix, branches that share leading tokens sharing tree nodes (a trie per anchor); the target's final hidden states come back and the trainer applies the frozen
   target LM head, giving p_1 (anchor row) and p_{i+1} (row of branch token i) on the branch's own history;
4. loss E2E-TV: L = 1 - (1/G) sum_j prod_{i<=j} alpha_i, alpha_i = sum_v min(p_i(v), q_i(v)), per branch, mean.
Only the first G-1 sampled tokens of a branch are scored (the last token's row would predict beyond the block).
No sequential draft-and-verify rollout is needed. With ``minibatches`` > 1 one scored batch (steps 1-3 for
``minibatches`` times the anchors) feeds that many optimizer steps (:mod:`.specopd_batch`). Other losses with a tree form (tv, fkl, rkl, e2e_tv_fused; see
:data:`specopd_kernels.losses.TREE_LOSSES`) can replace E2E-TV.
"""

from __future__ import annotations

from typing import Dict, List, Literal, Tuple

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


ROOT_LOSSES = ("e2e_fkl", "e2e_fkl_is")  # losses whose slot-1 term is weight x KL(p_1 || q_1) (root anchors)


class SpecOPDConfig(BaseModel):
    """SpecOPD hyper-parameters (strict)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=200, ge=1)
    max_minutes: float | None = Field(default=None, gt=0)
    seqs_per_step: int = Field(default=2, ge=1)
    anchors_per_seq: int = Field(default=32, ge=1)
    branches: int = Field(default=8, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    greedy_branch: bool = Field(
        default=False, description="branch 0 of every anchor is the argmax block (what SGLang's DFLASH worker "
                                   "proposes at every temperature); the other branches are sampled")
    loss: str = "e2e_tv"
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
    lr: float = Field(default=3e-4, gt=0)
    warmup_steps: int = Field(default=10, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    grad_clip: float = Field(default=1.0, gt=0)
    seed: int = 0
    log_every: int = Field(default=5, ge=1)
    ckpt_every: int = Field(default=25, ge=1)
    push_every: int = Field(default=0, ge=0, description="hot-swap into the server every N steps (0 = only at end)")
    head_dtype: Literal["float32", "bfloat16"] = Field(
        default="bfloat16", description="dtype of the frozen target LM-head matmul giving p (SGLang serves bf16)")

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        from specopd_kernels.losses import TREE_LOSSES

        if v not in TREE_LOSSES:
            raise ValueError(f"unknown SpecOPD loss {v!r}; valid: {', '.join(TREE_LOSSES)}")
        return v

    @model_validator(mode="after")
    def _reference_branch_loss(self):
        if self.reference_branch > 0 and self.loss != "e2e_fkl_is":
            raise ValueError(f"reference_branch > 0 needs loss e2e_fkl_is, got {self.loss!r}")
        if self.root_anchors_per_seq > 0 and self.loss not in ROOT_LOSSES:
            raise ValueError(f"root_anchors_per_seq > 0 needs loss {' or '.join(ROOT_LOSSES)}, got {self.loss!r}")
        if self.root_anchors_per_seq > 0 and self.reference_branch > 0:
            raise ValueError("root_anchors_per_seq and reference_branch cannot be combined")
        return self

    @property
    def branches_per_anchor(self) -> int:
        """Branches the loss trains on per anchor: the sampled ones plus the reference branch when it is on."""
        return self.branches + (1 if self.reference_branch > 0 else 0)


def sample_branches(draft_logits: torch.Tensor, k: int, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """``k`` branches per block from independent per-slot categorical q: long [nB, k, G]."""
    probs = torch.softmax(draft_logits.detach().float() / temperature, dim=-1)  # [nB, G, V]
    nb, g, v = probs.shape
    flat = probs.reshape(nb * g, v)
    draws = torch.multinomial(flat, k, replacement=True, generator=gen)  # [nB*G, k]
    return draws.view(nb, g, k).permute(0, 2, 1).contiguous()


def draft_slot_logits(drafter, seq, anchors: torch.Tensor, roots: torch.Tensor,
                      head_dtype: str = "float32") -> Tuple[torch.Tensor, torch.Tensor]:
    """Drafter logits for branch anchors (slots 1..G, ``[A, G, V]``) and root anchors (slot 1 only, ``[R, V]``).

    One drafter forward over all A + R blocks (the training mask: each block sees the reference features before
    its anchor), whose last layer runs on the slots the loss uses only (``slots`` of
    :meth:`DFlashDrafter.forward_blocks`), as does the vocabulary head (the head dominates the drafter's cost),
    its matmul in ``head_dtype`` (:func:`target_head_logits`: bfloat16 uses a cached bf16 copy of the frozen head,
    so an autocast forward does not re-cast the ``[V, H]`` weight every call); logits come back fp32 with their
    graph. ``seq`` has ``features [L, K*H]`` and ``token_ids [L]``; anchors / roots: int64 ``[A]`` / ``[R]``.
    """
    a_n, r_n, b = anchors.numel(), roots.numel(), drafter.block_size
    slots = torch.zeros(a_n + r_n, b, dtype=torch.bool)
    slots[:a_n, 1:] = True
    slots[a_n:, 1] = True
    hidden, _ = drafter.block_hidden(seq.features.float(), seq.token_ids, torch.cat([anchors, roots]), slots)
    head = drafter._head()
    return (target_head_logits(head, hidden[: a_n * (b - 1)].view(a_n, b - 1, -1), head_dtype),
            target_head_logits(head, hidden[a_n * (b - 1):], head_dtype))


def root_slot1_correction(*, loss_alpha: torch.Tensor, kb: int, g: int, p_anchor: torch.Tensor,
                          q_anchor: torch.Tensor, p_root: torch.Tensor, q_root: torch.Tensor,
                          weights: str) -> torch.Tensor:
    """Add-on to a tree E2E-KL loss that estimates its slot-1 term over branch AND root anchors (fp32 scalar).

    The tree loss is ``mean_a S_a + (slots 2..G)`` with ``S_a = (1/G) D_a KL(p_1(a) || q_1(a))`` and
    ``D_a = mean_k c[(a, k), 0] = mean_k (1 + sum_{j>=2} prod_{2<=i<=j} alpha_i)`` (the E2E weight of slot 1, the
    same for plain and accepted-prefix weights). Slot 1 is conditioned on the reference prefix only, so it needs no
    branch: at R root anchors ``S_r = (1/G) D_bar KL(p_1(r) || q_1(r))`` with ``D_bar = mean_a D_a`` (the
    downstream chain is unknown there). Returns ``(sum_r S_r - R mean_a S_a) / (A + R)``, so that loss +
    correction = ``mean over all A + R anchors of S`` + ``(slots 2..G over the A branch anchors)``: the same
    expectation, slot 1 averaged over (A + R) / A times more contexts (Rao-Blackwellisation over anchors).

    loss_alpha: detached ``[A*kb, G]`` alpha of the tree loss's branches (anchor-major); p_anchor / q_anchor:
    target / drafter slot-1 logits ``[A, V]`` at branch anchors; p_root / q_root ``[R, V]``. Raises ValueError
    for weights other than :data:`ROOT_LOSSES`.
    """
    from specopd_kernels.losses.e2e_kl import acceptance_weights
    from specopd_kernels.losses.naive import forward_kl

    if weights not in ROOT_LOSSES:
        raise ValueError(f"root anchors need loss {' or '.join(ROOT_LOSSES)}, got {weights!r}")
    a_n, r_n = p_anchor.shape[0], p_root.shape[0]
    d = acceptance_weights(loss_alpha).view(a_n, kb, g)[:, :, 0].mean(1)  # [A], detached
    s_anchor = d * forward_kl(p_anchor, q_anchor, reduction="none") / g  # [A]
    s_root = d.mean() * forward_kl(p_root, q_root, reduction="none") / g  # [R]
    return (s_root.sum() - r_n * s_anchor.mean()) / (a_n + r_n)


_HEAD_CACHE: Dict[tuple, torch.Tensor] = {}


def target_head_logits(head, hidden: torch.Tensor, dtype: str = "float32", fp32_out: bool = True) -> torch.Tensor:
    """Target logits ``[..., V]`` from final hidden states ``[..., H]``, the matmul in ``dtype``.

    bfloat16 keeps a cached bf16 copy of the frozen head (AMX / tensor cores; the served target computes its
    logits in bf16 too); float32 is :meth:`TargetHead.logits` exactly. The result is fp32 unless ``fp32_out`` is
    False, when bf16 logits stay bf16 (for consumers that convert row chunks themselves, such as the streamed
    E2E-KL tree loss: the same values without an ``[R, V]`` fp32 copy).
    """
    from specopd_trainer.drafters.target_head import flat_matmul_t

    if dtype == "float32":
        return head.logits(hidden.float()).float()
    w = head.lm_head
    key = (w.data_ptr(), w.device, dtype)
    if key not in _HEAD_CACHE:
        _HEAD_CACHE.clear()
        _HEAD_CACHE[key] = w.to(torch.bfloat16)
    out = flat_matmul_t(hidden.to(torch.bfloat16), _HEAD_CACHE[key])
    return out.float() if fp32_out else out


def reference_blocks(token_ids: torch.Tensor, anchors: torch.Tensor, g: int) -> torch.Tensor:
    """The reference continuation of every anchor, int64 ``[A, g]``: ``token_ids[a+1 .. a+g]``, -1 past the end."""
    pos = anchors[:, None] + 1 + torch.arange(g)[None]  # [A, g]
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    return torch.where(pos < ids.numel(), ids[pos.clamp(max=ids.numel() - 1)], torch.full_like(pos, -1))


def specopd_step(drafter, client, seqs: List, cfg: SpecOPDConfig, gen: torch.Generator) -> Tuple[torch.Tensor, Dict]:
    """Forward + sample + score + loss for one step (no optimiser); returns (loss, metrics).

    One scored batch of one minibatch (:mod:`.specopd_batch`, whatever ``cfg.minibatches`` says): the drafter
    forward at the anchors is both the sampling and the loss forward. Branches are trie-packed per anchor
    (:mod:`.branch_tree`): shared branch prefixes are scored once and the loss runs once per distinct row
    (:func:`specopd_kernels.losses.tree_loss`, equal to the loss on the expanded branches). Metrics:
    ``supervised_tokens`` = anchors x branches x G (branch tokens the loss trains on) + root anchors,
    ``scored_rows`` = distinct target rows behind them (anchor rows + tree nodes), ``alpha`` per slot (mean over
    branches), ``est_tau`` = 1 + E[A] from those alphas, wall seconds ``draft_s`` (drafter forward + sampling +
    packing), ``score_s`` (the server call), ``loss_s`` (target head + loss forward). With
    ``cfg.reference_branch`` the reference continuation is one more branch per anchor (counted in
    ``supervised_tokens``; ``alpha`` / ``est_tau`` stay over the sampled branches). Raises ValueError when no
    sequence has a response position to anchor at.
    """
    from specopd_trainer.loops.specopd_batch import minibatch_loss, sample_and_score

    return minibatch_loss(drafter, sample_and_score(drafter, client, seqs, cfg, gen, minibatches=1), 0, cfg)
