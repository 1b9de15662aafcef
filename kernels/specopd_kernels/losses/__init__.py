"""Drafter losses: plain-torch references (naive) and the fused Triton E2E-TV path (fused)."""

from .fused import fused_acceptance_alpha, fused_e2e_tv_loss, triton_available
from .naive import (
    acceptance_alpha,
    ce_decay_loss,
    draft_opd_loss,
    e2e_tv_from_alpha,
    e2e_tv_loss,
    expected_acceptance_length,
    forward_kl,
    reverse_kl,
    tv_loss,
)
from .e2e_kl import acceptance_weights, accepted_prefix_weights, draft_accept_ratio, e2e_fkl_is_loss, e2e_fkl_loss
from .registry import LOSSES, get_loss
from .chunked import chunked_tree_alpha
from .tree import TREE_LOSSES, tree_alpha, tree_alpha_reference, tree_loss, tree_loss_and_alpha

__all__ = [
    "acceptance_alpha", "expected_acceptance_length", "e2e_tv_from_alpha", "e2e_tv_loss", "tv_loss",
    "forward_kl", "reverse_kl", "ce_decay_loss", "draft_opd_loss", "acceptance_weights", "e2e_fkl_loss",
    "accepted_prefix_weights", "draft_accept_ratio", "e2e_fkl_is_loss",
    "fused_acceptance_alpha", "fused_e2e_tv_loss", "triton_available", "LOSSES", "get_loss",
    "TREE_LOSSES", "tree_alpha", "tree_alpha_reference", "tree_loss", "tree_loss_and_alpha", "chunked_tree_alpha",
]
