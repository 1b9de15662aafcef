"""A T=0-aligned drafter objective: hard cross-entropy towards the target's greedy tokens, each slot weighted by
whether a greedy (T=0) verifier would reach it with the drafter's own argmax chain.

At T=0 a block's slot k is verified only when the drafter's argmax equals the target's token at every slot before
it; the served acceptance length is the length of that chain. Plain SFT (ce_decay) spends its gradient on every slot
with a fixed decay, including slots a greedy verifier never reaches; this loss puts it where the T=0 served tau is
decided: the reached slots, the first miss included (issue 52's "T0-aligned objective").
"""

from __future__ import annotations

import torch

from specopd_kernels.losses.naive import check_logits_labels


def t0_chain_ce_loss(draft_logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """L = sum_{n,k} w_{n,k} CE_{n,k} / sum_{n,k} w_{n,k}, w_{n,1} = 1, w_{n,k} = prod_{j<k} [argmax q_{n,j} = y_{n,j}]
    (detached; an ignored label ends the chain: w = 0 from it on).

    draft_logits: [N, G, V] float (computed in fp32); labels: int64 [N, G] (slot k = column k-1, the target's greedy
    tokens), ignore_index marks padding. Returns an fp32 scalar (0 with a graph when no slot is reached). Raises
    TypeError / ValueError on bad dtypes, shapes or labels outside [0, V). Source: ours (issue 52), the greedy
    special case of E2E's acceptance weights with the argmax chain in place of prod q(y)."""
    check_logits_labels(draft_logits, labels)
    v = draft_logits.shape[-1]
    valid = labels != ignore_index
    if ((labels[valid] < 0) | (labels[valid] >= v)).any():
        raise ValueError(f"labels must lie in [0, {v}) or equal ignore_index={ignore_index}")
    safe = torch.where(valid, labels, torch.zeros_like(labels)).long()
    logp = torch.log_softmax(draft_logits.float(), dim=-1)
    ce = -logp.gather(-1, safe[..., None])[..., 0]
    with torch.no_grad():
        hit = (logp.argmax(-1) == safe) & valid
        before = torch.cumprod(torch.cat([torch.ones_like(hit[:, :1]), hit[:, :-1]], dim=1).float(), dim=1)
        w = before * valid.float()
    return (w * ce).sum() / w.sum().clamp(min=1.0)


def t0_chain_weights(draft_logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """The loss's slot weights ``[N, G]`` (1 where a greedy verifier reaches the slot), for diagnostics."""
    valid = labels != ignore_index
    hit = (draft_logits.argmax(-1) == labels) & valid
    return torch.cumprod(torch.cat([torch.ones_like(hit[:, :1]), hit[:, :-1]], 1).float(), 1) * valid.float()
