"""Drafter losses: plain-torch references (naive), the fused Triton E2E-TV path (fused), their proposal-tree forms
(tree) and the one registry of names (registry: :data:`LOSSES` of :class:`LossSpec`, flat and tree form side by side)."""

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
from .registry import (LOSSES, LossSpec, get_loss, get_loss_spec, register_loss, root_anchor_losses, tree_loss,
                       tree_loss_and_alpha, tree_losses)
from .chunked import chunked_tree_alpha
from .tree import tree_alpha, tree_alpha_reference

__all__ = [
    "acceptance_alpha", "expected_acceptance_length", "e2e_tv_from_alpha", "e2e_tv_loss", "tv_loss",
    "forward_kl", "reverse_kl", "ce_decay_loss", "draft_opd_loss", "acceptance_weights", "e2e_fkl_loss",
    "accepted_prefix_weights", "draft_accept_ratio", "e2e_fkl_is_loss",
    "fused_acceptance_alpha", "fused_e2e_tv_loss", "triton_available", "LOSSES", "LossSpec", "get_loss",
    "get_loss_spec", "register_loss", "tree_losses", "root_anchor_losses", "tree_alpha", "tree_alpha_reference",
    "tree_loss", "tree_loss_and_alpha", "chunked_tree_alpha",
]
