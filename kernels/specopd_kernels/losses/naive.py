"""Drafter training losses in plain torch (fp32 softmax at temperature 1). References for the fused kernels.

Shapes: V = vocabulary; N = blocks; G = gamma = block_size - 1 drafted slots per block.  Slot k = 1..G
(column k-1) predicts position a+k of an anchor a.  "target" = p (frozen large model), "draft" = q.
Sources: SpecOPD (E2E-TV surrogate, alpha = sum_v min(p, q)); Leviathan et al. 2023 / Chen et al. 2023
(speculative sampling acceptance); DFlash z-lab/dflash + SpecForge (decayed CE); Draft-OPD
bingyang-lei/Draft-OPD (acceptance-aware FKL/RKL mix).  Formulas: /work/shared/notes/algorithms.md.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "acceptance_alpha", "expected_acceptance_length", "e2e_tv_from_alpha", "e2e_tv_loss", "tv_loss",
    "forward_kl", "reverse_kl", "ce_decay_loss", "draft_opd_loss", "draft_opd_terms",
]

_REDUCTIONS = ("mean", "sum", "none")


def check_pair(target_logits: torch.Tensor, draft_logits: torch.Tensor, blocks: bool = False) -> None:
    """Validate a (target, draft) logits pair: same shape [..., V] (or [N, G, V] if blocks), floating dtype.

    Raises TypeError (not a tensor / not floating point) or ValueError (shape mismatch, empty V, wrong rank).
    """
    for name, x in (("target_logits", target_logits), ("draft_logits", draft_logits)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if target_logits.shape != draft_logits.shape:
        raise ValueError(f"shape mismatch: target {tuple(target_logits.shape)} vs draft {tuple(draft_logits.shape)}")
    if target_logits.dim() < 1 or target_logits.shape[-1] == 0:
        raise ValueError(f"logits need a non-empty vocabulary dim, got shape {tuple(target_logits.shape)}")
    if blocks and target_logits.dim() != 3:
        raise ValueError(f"expected [N, G, V] logits, got shape {tuple(target_logits.shape)}")


def check_logits_labels(draft_logits, labels) -> None:
    """Raise TypeError / ValueError unless ``draft_logits`` is a float [N, G, V] tensor and ``labels`` an integer
    [N, G] tensor (the slot losses' inputs)."""
    if not isinstance(draft_logits, torch.Tensor) or not draft_logits.dtype.is_floating_point:
        raise TypeError("draft_logits must be a floating point tensor")
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be [N, G, V], got shape {tuple(draft_logits.shape)}")
    if not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise TypeError("labels must be an integer tensor")
    if tuple(labels.shape) != tuple(draft_logits.shape[:2]):
        raise ValueError(f"labels shape {tuple(labels.shape)} != {tuple(draft_logits.shape[:2])}")


def check_mask(mask: Optional[torch.Tensor], shape, name: str) -> Optional[torch.Tensor]:
    """Validate an optional bool mask of the given shape and return it (None passes through).

    Raises TypeError if it is not a bool tensor, ValueError if its shape differs from ``shape``.
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} shape {tuple(mask.shape)} != expected {tuple(shape)}")
    return mask


def _reduce(per_tok: torch.Tensor, mask: Optional[torch.Tensor], reduction: str) -> torch.Tensor:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if mask is not None:
        per_tok = torch.where(mask, per_tok, torch.zeros_like(per_tok))
    if reduction == "none":
        return per_tok
    if reduction == "sum":
        return per_tok.sum()
    count = per_tok.numel() if mask is None else int(mask.sum())
    return per_tok.sum() / max(count, 1)


def acceptance_alpha(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Per-position acceptance probability alpha = sum_v min(p(v), q(v)) = 1 - TV(p, q).

    target_logits, draft_logits: [..., V], any float dtype (softmax in fp32).  Returns fp32 [...].
    Gradient flows to both inputs via torch.minimum (ties split 1/2-1/2).  Source: speculative sampling
    (Leviathan et al. 2023, Thm 3.5); SpecOPD E2E-TV.
    """
    check_pair(target_logits, draft_logits)
    p = torch.softmax(target_logits.float(), dim=-1)
    q = torch.softmax(draft_logits.float(), dim=-1)
    return torch.minimum(p, q).sum(dim=-1)


def _masked_alpha(alpha: torch.Tensor, valid_mask: Optional[torch.Tensor]) -> torch.Tensor:
    if alpha.dim() != 2:
        raise ValueError(f"alpha must be [N, G], got shape {tuple(alpha.shape)}")
    valid_mask = check_mask(valid_mask, alpha.shape, "valid_mask")
    if valid_mask is None:
        return alpha
    return torch.where(valid_mask, alpha, torch.zeros_like(alpha))


def expected_acceptance_length(alpha: torch.Tensor, valid_mask: Optional[torch.Tensor] = None):
    """E[A] = sum_{j=1..G} prod_{i<=j} alpha_i and tau = 1 + E[A] per block.

    alpha: float [N, G] per-slot acceptance probabilities.  valid_mask: optional bool [N, G]; an invalid slot
    counts as alpha = 0, i.e. the accept chain cannot continue through it (slots past a block's valid length
    add nothing).  Returns (expected_accepted fp-like-alpha [N], tau [N]).  Source: SpecOPD; the sum of
    survival probabilities P(A >= j) for independent per-slot acceptance.
    """
    surv = torch.cumprod(_masked_alpha(alpha, valid_mask), dim=1)
    ea = surv.sum(dim=1)
    return ea, 1.0 + ea


def e2e_tv_from_alpha(alpha: torch.Tensor, valid_mask: Optional[torch.Tensor] = None,
                      reduction: str = "mean") -> torch.Tensor:
    """E2E-TV loss from per-slot alpha [N, G]: L_n = 1 - E[A]_n / G (G = alpha.shape[1], fixed).

    Invalid slots (valid_mask False) contribute alpha = 0 to the product, so a block with valid length
    g < G is normalised by G too (its best loss is 1 - g/G).  reduction: "mean" over the N blocks, "sum",
    or "none" ([N]).  Source: SpecOPD E2E-TV surrogate.
    """
    if alpha.dim() != 2 or alpha.shape[1] == 0:
        raise ValueError(f"alpha must be [N, G] with G >= 1, got shape {tuple(alpha.shape)}")
    ea, _ = expected_acceptance_length(alpha, valid_mask)
    return _reduce(1.0 - ea / alpha.shape[1], None, reduction)


def e2e_tv_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor, valid_mask: Optional[torch.Tensor] = None,
                reduction: str = "mean") -> torch.Tensor:
    """E2E-TV: L = 1 - (1/G) sum_{j=1..G} prod_{i<=j} alpha_i per block, fp32, mean over blocks by default.

    target_logits, draft_logits: [N, G, V] (slot k on column k-1, same prefixes for p and q: the drafter's
    own sampled history, so the product estimates P(A >= j) on-policy).  valid_mask: optional bool [N, G]
    (see :func:`e2e_tv_from_alpha`).  Returns fp32 scalar (or [N] for reduction="none").  Source: SpecOPD.
    """
    check_pair(target_logits, draft_logits, blocks=True)
    return e2e_tv_from_alpha(acceptance_alpha(target_logits, draft_logits), valid_mask, reduction)


def tv_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor, valid_mask: Optional[torch.Tensor] = None,
            reduction: str = "mean") -> torch.Tensor:
    """Per-token total variation TV(p, q) = 1 - alpha = 0.5 sum_v |p - q|, mean over valid tokens.

    logits: [..., V]; valid_mask: optional bool [...].  Returns fp32 scalar ([...] for "none", invalid = 0).
    """
    tv = 1.0 - acceptance_alpha(target_logits, draft_logits)
    return _reduce(tv, check_mask(valid_mask, tv.shape, "valid_mask"), reduction)


def _kl(a_logits: torch.Tensor, b_logits: torch.Tensor, log_prob_min: Optional[float]) -> torch.Tensor:
    """KL(a || b) = sum_v a(v) (log a(v) - log b(v)) per row, fp32; log-probs clamped at >= log_prob_min."""
    la = torch.log_softmax(a_logits.float(), dim=-1)
    lb = torch.log_softmax(b_logits.float(), dim=-1)
    pa = la.exp()
    if log_prob_min is not None:
        la, lb = la.clamp(min=log_prob_min), lb.clamp(min=log_prob_min)
    return (pa * (la - lb)).sum(dim=-1)


def forward_kl(target_logits: torch.Tensor, draft_logits: torch.Tensor, valid_mask: Optional[torch.Tensor] = None,
               reduction: str = "mean", log_prob_min: Optional[float] = None) -> torch.Tensor:
    """Forward KL(p || q) = sum_v p (log p - log q) per token (mass-covering), mean over valid tokens.

    logits: [..., V]; valid_mask: optional bool [...]; log_prob_min: optional clamp of both log-probs
    (Draft-OPD uses -10).  Returns fp32 scalar ([...] for "none").
    """
    check_pair(target_logits, draft_logits)
    kl = _kl(target_logits, draft_logits, log_prob_min)
    return _reduce(kl, check_mask(valid_mask, kl.shape, "valid_mask"), reduction)


def reverse_kl(target_logits: torch.Tensor, draft_logits: torch.Tensor, valid_mask: Optional[torch.Tensor] = None,
               reduction: str = "mean", log_prob_min: Optional[float] = None) -> torch.Tensor:
    """Reverse KL(q || p) = sum_v q (log q - log p) per token (mode-seeking), mean over valid tokens.

    Same arguments as :func:`forward_kl` (target first).  Returns fp32 scalar ([...] for "none").
    """
    check_pair(target_logits, draft_logits)
    kl = _kl(draft_logits, target_logits, log_prob_min)
    return _reduce(kl, check_mask(valid_mask, kl.shape, "valid_mask"), reduction)


def ce_decay_loss(draft_logits: torch.Tensor, labels: torch.Tensor, gamma_decay: float = 7.0,
                  ignore_index: int = -100) -> torch.Tensor:
    """DFlash SFT loss: L = sum_k w_k CE_k / sum_k w_k over valid labels, w_k = exp(-(k-1)/gamma_decay).

    draft_logits: [N, G, V] float (fp32 log-softmax); labels: int64 [N, G] (slot k = column k-1, the anchor
    slot 0 is not included), ignore_index marks padding.  Returns fp32 scalar (0 with a graph if no valid
    label).  Raises ValueError for gamma_decay <= 0 or a label outside [0, V).  Source: DFlash (z-lab/dflash),
    SpecForge specforge/core/dflash.py; gamma ~7 for block 16.
    """
    check_logits_labels(draft_logits, labels)
    if not gamma_decay > 0:
        raise ValueError(f"gamma_decay must be > 0, got {gamma_decay}")
    n, g, v = draft_logits.shape
    valid = labels != ignore_index
    if ((labels[valid] < 0) | (labels[valid] >= v)).any():
        raise ValueError(f"labels must lie in [0, {v}) or equal ignore_index={ignore_index}")
    safe = torch.where(valid, labels, torch.zeros_like(labels)).long()
    ce = -torch.log_softmax(draft_logits.float(), dim=-1).gather(-1, safe[..., None])[..., 0]
    w = torch.exp(-torch.arange(g, dtype=torch.float32, device=draft_logits.device) / gamma_decay)
    w = w[None, :] * valid.float()
    return (w * torch.where(valid, ce, torch.zeros_like(ce))).sum() / w.sum().clamp(min=1e-12)


_KL_DIRECTIONS = ("forward", "reverse")


def draft_opd_terms(target_logits: torch.Tensor, draft_logits: torch.Tensor, accepted: torch.Tensor,
                    slot: torch.Tensor, gamma: float = 0.8, lambda_acc: float = 1.0, lambda_rej: float = 1.0,
                    log_prob_min: Optional[float] = -10.0, loss_max: Optional[float] = 10.0,
                    accepted_kl: str = "forward", rejected_kl: str = "reverse") -> torch.Tensor:
    """The Draft-OPD loss on M supervised (block, slot) pairs, given row by row (the core of the flat and tree forms).

    target_logits, draft_logits: ``[M, V]`` float, pair m's target p and drafter q; accepted: bool ``[M]`` (True:
    an accepted slot, False: a rejected one); slot: int64 ``[M]``, the 0-based in-block slot (k - 1, so the
    rejected weight is gamma^slot). L = (l_a sum_acc KL_acc + l_r sum_rej w KL_rej) / (l_a N_acc + l_r sum_rej w),
    KL_acc = KL(p || q) and KL_rej = KL(q || p) by default (``accepted_kl`` / ``rejected_kl``: "forward" or
    "reverse", the single-direction ablations), log-probs clamped at >= ``log_prob_min`` and per-token losses
    to [-loss_max, loss_max] (None disables a clamp). Returns an fp32 scalar (0 with a graph when M = 0 or the
    denominator is 0). Raises ValueError for gamma outside (0, 1], negative lambdas or an unknown direction.
    Source: bingyang-lei/Draft-OPD verl/verl/trainer/distillation/losses.py (``_build_rejected_draft_position_weights``:
    weight decay^(offset - 1) by the 1-based in-block offset; the combined stream normalisation).
    """
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if lambda_acc < 0 or lambda_rej < 0:
        raise ValueError(f"lambda_acc and lambda_rej must be >= 0, got {lambda_acc}, {lambda_rej}")
    for nm, d in (("accepted_kl", accepted_kl), ("rejected_kl", rejected_kl)):
        if d not in _KL_DIRECTIONS:
            raise ValueError(f"{nm} must be one of {_KL_DIRECTIONS}, got {d!r}")
    fkl = _kl(target_logits, draft_logits, log_prob_min)
    rkl = _kl(draft_logits, target_logits, log_prob_min)
    if loss_max is not None:
        fkl, rkl = fkl.clamp(-loss_max, loss_max), rkl.clamp(-loss_max, loss_max)
    acc_term = fkl if accepted_kl == "forward" else rkl
    rej_term = rkl if rejected_kl == "reverse" else fkl
    acc = accepted.float()
    w = torch.pow(torch.tensor(float(gamma), device=fkl.device), slot.float()) * (1.0 - acc)
    zero = torch.zeros_like(fkl)
    num = lambda_acc * torch.where(accepted, acc_term, zero).sum() + lambda_rej * (w * torch.where(
        accepted, zero, rej_term)).sum()
    den = lambda_acc * acc.sum() + lambda_rej * w.sum()
    if float(den) == 0.0:
        return num * 0.0
    return num / den


def draft_opd_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor, accepted_mask: torch.Tensor,
                   rejected_mask: torch.Tensor, gamma: float = 0.8, lambda_acc: float = 1.0,
                   lambda_rej: float = 1.0, log_prob_min: Optional[float] = -10.0,
                   loss_max: Optional[float] = 10.0, accepted_kl: str = "forward",
                   rejected_kl: str = "reverse") -> torch.Tensor:
    """Draft-OPD: FKL(p||q) on accepted tokens, gamma^(k-1)-weighted RKL(q||p) on rejected tokens.

    L = (l_a sum_acc FKL + l_r sum_rej w_k RKL) / (l_a N_acc + l_r sum_rej w_k), w_k = gamma^(k-1) for slot
    k = column + 1.  target_logits, draft_logits: [N, G, V] (scored on the drafter-generated replay
    prefixes); accepted_mask, rejected_mask: bool [N, G], disjoint.  Log-probs clamped at >= log_prob_min
    and each per-token loss clamped to [-loss_max, loss_max] (bingyang-lei/Draft-OPD
    verl/trainer/distillation/losses.py clamps both sides; None disables a clamp).  ``accepted_kl`` /
    ``rejected_kl``: "forward" or "reverse" (the single-direction ablations; default the paper's mix).  Returns
    fp32 scalar (0 with a graph when both masks are empty).  Raises ValueError for overlapping masks, gamma
    outside (0, 1], negative lambdas or an unknown direction. The rows are reduced by :func:`draft_opd_terms`.
    """
    check_pair(target_logits, draft_logits, blocks=True)
    shape = target_logits.shape[:2]
    acc = check_mask(accepted_mask, shape, "accepted_mask")
    rej = check_mask(rejected_mask, shape, "rejected_mask")
    if (acc & rej).any():
        raise ValueError("accepted_mask and rejected_mask overlap: a token is either accepted or rejected")
    sel = acc | rej
    slot = torch.arange(shape[1], device=target_logits.device).expand(shape)
    return draft_opd_terms(target_logits[sel], draft_logits[sel], acc[sel], slot[sel], gamma, lambda_acc,
                           lambda_rej, log_prob_min, loss_max, accepted_kl, rejected_kl)
