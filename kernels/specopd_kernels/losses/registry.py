"""Name -> loss function registry used by trainer configs."""

from __future__ import annotations

from typing import Callable

from .e2e_kl import e2e_fkl_is_loss, e2e_fkl_loss
from .fused import fused_e2e_tv_loss
from .naive import ce_decay_loss, draft_opd_loss, e2e_tv_loss, forward_kl, reverse_kl, tv_loss

__all__ = ["LOSSES", "get_loss"]

LOSSES: dict[str, Callable] = {
    "ce_decay": ce_decay_loss,  # (draft_logits [N,G,V], labels [N,G], gamma_decay, ignore_index)
    "tv": tv_loss,  # (target_logits, draft_logits, valid_mask, reduction)
    "fkl": forward_kl,  # (target_logits, draft_logits, valid_mask, reduction, log_prob_min)
    "rkl": reverse_kl,  # (target_logits, draft_logits, valid_mask, reduction, log_prob_min)
    "e2e_tv": e2e_tv_loss,  # (target_logits [N,G,V], draft_logits [N,G,V], valid_mask [N,G], reduction)
    "e2e_tv_fused": fused_e2e_tv_loss,  # same as e2e_tv; Triton; no grad to target
    "e2e_fkl": e2e_fkl_loss,  # (target_logits [N,G,V], draft_logits [N,G,V], valid_mask [N,G], reduction)
    "e2e_fkl_is": e2e_fkl_is_loss,  # (target_logits, draft_logits, tokens [N,G], temperature, valid_mask, reduction)
    "draft_opd": draft_opd_loss,  # (target_logits, draft_logits, accepted_mask, rejected_mask, gamma, ...)
}


def get_loss(name: str) -> Callable:
    """Return the loss function registered under ``name``.

    Raises KeyError listing the valid names when ``name`` is unknown.
    """
    try:
        return LOSSES[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown loss {name!r}; valid names: {', '.join(sorted(LOSSES))}") from None
