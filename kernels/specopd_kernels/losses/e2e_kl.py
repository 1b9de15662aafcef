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

__all__ = ["acceptance_weights", "accepted_prefix_weights", "draft_accept_ratio", "e2e_fkl_from_kl", "e2e_fkl_loss",
           "e2e_fkl_is_loss"]


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


def accepted_prefix_weights(alpha: torch.Tensor, accept_ratio: torch.Tensor,
                            valid_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """E2E weights with the branch's own acceptance ratios upstream: detached fp32 ``[N, G]``

        c_is[n, i] = (prod_{l<i} r[n, l]) * (1 + sum_{j>i} prod_{i<l<=j} alpha[n, l]),
        r[n, l] = min(1, p_l(x_l) / q_l(x_l))   (x_l the branch's sampled token at slot l, q its sampling law)

    :func:`acceptance_weights` is the same product with alpha upstream: c[n, i] = (prod_{l<i} alpha[n, l]) *
    (1 + ...). Why r: a branch sampled from q reaches slot i of a served block only if its drafts x_1..x_{i-1}
    were all accepted, which lossless speculative sampling does with probability prod_{l<i} r_l; E_{x_l ~ q}[r_l]
    = alpha_l, so the expected weight of every slot is E2E's, but it sits on the branches whose prefixes the
    target accepts (distributed as min(p, q) per slot, the states a served block actually reaches) instead of
    being spread evenly over every sampled prefix, most of which a weak drafter's block never reaches. This is
    the importance weight of the served block's state distribution relative to the sampling one (Leviathan et
    al. 2023, acceptance rule; SpecOPD's E2E weights downstream).

    alpha: float ``[N, G]``; accept_ratio: float ``[N, G-1]`` (or ``[N, G]``, last column unused), values in
    [0, 1]; valid_mask: optional bool ``[N, G]`` (invalid slots weigh 0 and stop the downstream sums). Raises
    ValueError on bad shapes or ratios outside [0, 1].
    """
    a = _masked_alpha(alpha.detach().float(), valid_mask)
    if a.dim() != 2:
        raise ValueError(f"alpha must be [N, G], got {tuple(alpha.shape)}")
    n, g = a.shape
    r = accept_ratio.detach().float()
    if r.dim() != 2 or r.shape[0] != n or r.shape[1] not in (g - 1, g):
        raise ValueError(f"accept_ratio must be [N, G-1] = [{n}, {g - 1}] (or [N, G]), got {tuple(r.shape)}")
    if r.numel() and (float(r.min()) < 0 or float(r.max()) > 1 + 1e-6):
        raise ValueError("accept_ratio entries must lie in [0, 1]")
    up = torch.cumprod(torch.cat([torch.ones(n, 1, dtype=a.dtype, device=a.device), r[:, : g - 1]], 1), dim=1)
    down = torch.ones_like(a)
    for i in range(g - 2, -1, -1):
        down[:, i] = 1 + a[:, i + 1] * down[:, i + 1]
    c = up * down
    if valid_mask is not None:
        c = torch.where(valid_mask, c, torch.zeros_like(c))
    return c


def draft_accept_ratio(target_logits: torch.Tensor, draft_logits: torch.Tensor, tokens: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """r = min(1, p(x) / q_T(x)) per drafted token: fp32 ``[...]``, no gradient.

    target_logits, draft_logits: float ``[..., V]``; tokens: int64 ``[...]`` (x, drawn from q_T = softmax(draft /
    temperature)). p is softmax(target) (temperature 1, as everywhere in the losses). Raises ValueError on bad
    shapes or a non-positive temperature.
    """
    check_pair(target_logits, draft_logits)
    if tokens.shape != target_logits.shape[:-1] or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be int64 {tuple(target_logits.shape[:-1])}, got {tokens.dtype} "
                         f"{tuple(tokens.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    with torch.no_grad():
        lp = torch.log_softmax(target_logits.float(), -1).gather(-1, tokens[..., None])[..., 0]
        lq = torch.log_softmax(draft_logits.float() / temperature, -1).gather(-1, tokens[..., None])[..., 0]
        return torch.exp(torch.clamp(lp - lq, max=0.0))


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


def e2e_fkl_is_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor, tokens: torch.Tensor,
                    temperature: float = 1.0, valid_mask: Optional[torch.Tensor] = None,
                    reduction: str = "mean") -> torch.Tensor:
    """E2E-KL with accepted-prefix weights: ``mean_n (1/G) sum_i sg(c_is[n, i]) KL(p[n, i] || q[n, i])``.

    target_logits, draft_logits ``[N, G, V]`` on branch n's own prefixes (slot i's target row conditioned on the
    branch's tokens x_1..x_{i-1}); tokens int64 ``[N, G]``, the branch's sampled drafts (from softmax(draft /
    temperature)); c_is from :func:`accepted_prefix_weights` with r = :func:`draft_accept_ratio` on slots
    1..G-1. Returns an fp32 scalar (``[N]`` for reduction "none"); gradient only through the KL terms. Raises
    ValueError on bad shapes. The reference for the proposal-tree form ``e2e_fkl_is``.
    """
    check_pair(target_logits, draft_logits, blocks=True)
    with torch.no_grad():
        alpha = acceptance_alpha(target_logits, draft_logits)
        ratio = draft_accept_ratio(target_logits, draft_logits, tokens, temperature)
    kl = forward_kl(target_logits, draft_logits, reduction="none")
    per_block = (accepted_prefix_weights(alpha, ratio, valid_mask) * kl.float()).sum(dim=1) / alpha.shape[1]
    return _reduce(per_block, None, reduction)
