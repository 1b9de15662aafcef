"""E2E-KL: forward KL(p || q) per slot, weighted by how much that slot's acceptance moves E[A] (plain torch).

E2E-TV (SpecOPD) maximises E[A] = sum_j prod_{i<=j} alpha_i, alpha_i = sum_v min(p_i, q_i). Its gradient w.r.t. a
drafter logit is c_i * d alpha_i / d z with c_i = d E[A] / d alpha_i = sum_{j>=i} prod_{k<=j, k!=i} alpha_k, and
d alpha_i / d z_v = q_v (1[q_v < p_v] - Q_<) is proportional to q_v: from a weak drafter (alpha ~0.2) the target's
token gets almost no push (measured in README, "What the SpecOPD comparison shows"). E2E-KL keeps the acceptance
weights c_i (detached) and replaces 1 - alpha_i = TV(p_i, q_i) by KL(p_i || q_i), an upper bound by Pinsker
(TV <= sqrt(KL / 2)) whose gradient q - p moves the target's mass directly:

    L = mean_n (1/G) sum_i sg(c[n, i]) KL(p[n, i] || q[n, i])

So slots the chain rarely reaches (after an early likely rejection) are down-weighted exactly as in E2E-TV, and
rows conditioned on branch prefixes the target would reject count little. At q = p both losses are minimal.
"""

from __future__ import annotations

from typing import Optional

import torch

from .naive import _masked_alpha, _reduce, acceptance_alpha, check_pair, forward_kl

__all__ = ["acceptance_weights", "e2e_fkl_from_kl", "e2e_fkl_loss"]


def acceptance_weights(alpha: torch.Tensor, valid_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """c[n, i] = d E[A]_n / d alpha[n, i] = sum_{j>=i} prod_{k<=j, k!=i} alpha[n, k], detached fp32 ``[N, G]``.

    alpha: float ``[N, G]``; valid_mask: optional bool ``[N, G]`` (an invalid slot has alpha 0, as in
    :func:`specopd_kernels.losses.naive.expected_acceptance_length`, and weight 0). Raises ValueError on bad shapes.
    """
    a = _masked_alpha(alpha.detach().float(), valid_mask).clone().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(torch.cumprod(a, dim=1).sum(), a)
    if valid_mask is not None:
        grad = torch.where(valid_mask, grad, torch.zeros_like(grad))
    return grad.detach()


def e2e_fkl_from_kl(kl: torch.Tensor, alpha: torch.Tensor, valid_mask: Optional[torch.Tensor] = None,
                    reduction: str = "mean") -> torch.Tensor:
    """``(1/G) sum_i c[n, i] kl[n, i]`` per block from per-slot KL ``[N, G]`` and alpha ``[N, G]`` (c from
    :func:`acceptance_weights`); reduction "mean" over blocks, "sum", or "none" (``[N]``)."""
    if kl.shape != alpha.shape or kl.dim() != 2:
        raise ValueError(f"kl and alpha must both be [N, G], got {tuple(kl.shape)} and {tuple(alpha.shape)}")
    per_block = (acceptance_weights(alpha, valid_mask) * kl.float()).sum(dim=1) / alpha.shape[1]
    return _reduce(per_block, None, reduction)


def e2e_fkl_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor, valid_mask: Optional[torch.Tensor] = None,
                 reduction: str = "mean") -> torch.Tensor:
    """E2E-KL on blocks: target_logits, draft_logits ``[N, G, V]`` (same prefixes for p and q, as for E2E-TV);
    valid_mask optional bool ``[N, G]``. Returns an fp32 scalar (``[N]`` for reduction "none"). Gradient flows to
    ``draft_logits`` only through the KL terms (the weights are detached). Raises ValueError on bad shapes."""
    check_pair(target_logits, draft_logits, blocks=True)
    with torch.no_grad():
        alpha = acceptance_alpha(target_logits, draft_logits)
    kl = forward_kl(target_logits, draft_logits, reduction="none")
    return e2e_fkl_from_kl(kl, alpha, valid_mask, reduction)
