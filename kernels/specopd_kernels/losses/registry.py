"""The one loss registry: each name once, its flat form and its proposal-tree form side by side.

:data:`LOSSES` maps a name to a :class:`LossSpec`:

- ``flat``: the loss on expanded tensors (e.g. ``(target_logits [N,G,V], draft_logits [N,G,V], ...)``), what
  :func:`get_loss` returns;
- ``tree``: the same loss over a proposal tree (:mod:`.tree`: every distinct scored row once, branches gathered by
  ``row_index``), or None when the loss has no tree form (ce_decay); :func:`tree_loss_and_alpha`
  dispatches through it;
- flags the trainers read instead of keeping name lists of their own: ``root_anchor`` (the slot-1 term is
  weight x KL(p_1 || q_1), so SpecOPD's root anchors apply), ``bf16_rows`` (the tree form streams bf16 target rows
  in fp32 chunks itself), ``needs_tokens`` (the tree form needs the drafted tokens and their sampling
  temperature), ``greedy_branches`` (it accepts greedy-path branches), ``slot_masks`` (the tree form needs
  per-(branch, slot) accepted / rejected masks, which only rollout-driven trainers have: draft_opd, listed by
  ``tree_losses(slot_masks=True)`` only).

A new loss is one :func:`register_loss` call (here, or in the module defining it).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from .draft_opd_tree import tree_draft_opd
from .e2e_kl import e2e_fkl_is_loss, e2e_fkl_loss
from .fused import fused_e2e_tv_loss
from .t0_chain import t0_chain_ce_loss
from .naive import ce_decay_loss, draft_opd_loss, e2e_tv_loss, forward_kl, reverse_kl, tv_loss
from .tree import tree_e2e_fkl, tree_e2e_fkl_is, tree_e2e_tv, tree_e2e_tv_fused, tree_per_token

__all__ = ["LossSpec", "LOSSES", "register_loss", "get_loss", "get_loss_spec", "tree_losses", "root_anchor_losses",
           "tree_loss", "tree_loss_and_alpha"]


@dataclass(frozen=True)
class LossSpec:
    """One registered loss.

    name: registry key. flat: loss on expanded tensors (signature in its docstring). tree: its proposal-tree form
    ``(target_rows [R,V], draft_logits [Q,V], row_draft [R], row_index [N,G], with_alpha, **options) -> (loss,
    alpha [N,G] or None)`` or None. root_anchor / bf16_rows / needs_tokens / greedy_branches / slot_masks: see the
    module doc.
    summary: one line for listings and CLI help.
    """

    name: str
    flat: Callable
    tree: Optional[Callable] = None
    root_anchor: bool = False
    bf16_rows: bool = False
    needs_tokens: bool = False
    greedy_branches: bool = False
    slot_masks: bool = False
    summary: str = ""


_REGISTRY: Dict[str, LossSpec] = {}
LOSSES: Mapping[str, LossSpec] = MappingProxyType(_REGISTRY)  # read-only view, registration order


def register_loss(spec: LossSpec) -> LossSpec:
    """Add ``spec`` under ``spec.name``; returns it. Raises ValueError if the name is taken or a flag needs a tree
    form the spec does not have."""
    if spec.name in _REGISTRY:
        raise ValueError(f"loss {spec.name!r} is already registered")
    if spec.tree is None and (spec.root_anchor or spec.bf16_rows or spec.needs_tokens or spec.greedy_branches
                              or spec.slot_masks):
        raise ValueError(f"loss {spec.name!r}: tree-form flags set without a tree form")
    _REGISTRY[spec.name] = spec
    return spec


register_loss(LossSpec("e2e_tv", e2e_tv_loss, tree_e2e_tv, summary="E2E-TV surrogate of acceptance length (SpecOPD)"))
register_loss(LossSpec("e2e_tv_fused", fused_e2e_tv_loss, tree_e2e_tv_fused,
                       summary="E2E-TV on the Triton kernel (no grad to the target)"))
register_loss(LossSpec("e2e_fkl", e2e_fkl_loss, tree_e2e_fkl, root_anchor=True, bf16_rows=True,
                       summary="E2E-KL: KL(p || q) per slot with E2E's detached acceptance weights"))
register_loss(LossSpec("e2e_fkl_is", e2e_fkl_is_loss, tree_e2e_fkl_is, root_anchor=True, bf16_rows=True,
                       needs_tokens=True, greedy_branches=True,
                       summary="E2E-KL with accepted-prefix (importance) weights"))
register_loss(LossSpec("tv", tv_loss, tree_per_token(tv_loss), summary="per-token total variation"))
register_loss(LossSpec("fkl", forward_kl, tree_per_token(forward_kl), summary="per-token forward KL(p || q)"))
register_loss(LossSpec("rkl", reverse_kl, tree_per_token(reverse_kl), summary="per-token reverse KL(q || p)"))
register_loss(LossSpec("ce_decay", ce_decay_loss,
                       summary="DFlash SFT cross-entropy with slot decay: (draft_logits [N,G,V], labels [N,G], "
                               "gamma_decay, ignore_index)"))
register_loss(LossSpec("t0_chain_ce", t0_chain_ce_loss,
                       summary="T=0-aligned hard CE: slots weighted by the drafter's argmax chain reaching them "
                               "(draft_logits [N,G,V], labels [N,G], ignore_index)"))
register_loss(LossSpec("draft_opd", draft_opd_loss, tree_draft_opd, slot_masks=True,
                       summary="Draft-OPD: FKL on accepted slots, gamma^(k-1)-weighted RKL on rejected ones "
                               "(accepted_mask, rejected_mask)"))


def get_loss_spec(name: str) -> LossSpec:
    """The :class:`LossSpec` registered under ``name``. Raises KeyError listing the valid names."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown loss {name!r}; valid names: {', '.join(sorted(_REGISTRY))}") from None


def get_loss(name: str) -> Callable:
    """The flat form of loss ``name``. Raises KeyError listing the valid names when ``name`` is unknown."""
    return get_loss_spec(name).flat


def tree_losses(slot_masks: bool = False) -> Tuple[str, ...]:
    """Names with a proposal-tree form, in registration order; those whose tree form needs accepted / rejected
    slot masks (``LossSpec.slot_masks``, e.g. draft_opd) only with ``slot_masks=True``."""
    return tuple(n for n, s in _REGISTRY.items() if s.tree is not None and (slot_masks or not s.slot_masks))


def root_anchor_losses() -> Tuple[str, ...]:
    """Names whose slot-1 term is weight x KL(p_1 || q_1) (SpecOPD's root anchors apply)."""
    return tuple(n for n, s in _REGISTRY.items() if s.root_anchor)


def tree_loss(name: str, target_rows: torch.Tensor, draft_logits: torch.Tensor, row_draft: torch.Tensor,
              row_index: torch.Tensor, *, row_token: Optional[torch.Tensor] = None,
              sample_temperature: float = 1.0, greedy_branches: Optional[torch.Tensor] = None,
              greedy_tokens: Optional[torch.Tensor] = None, greedy_weight: float = 0.5,
              accepted_mask: Optional[torch.Tensor] = None, rejected_mask: Optional[torch.Tensor] = None,
              options: Optional[Mapping[str, Any]] = None) -> torch.Tensor:
    """Loss ``name`` (one of :func:`tree_losses`) over N branches x G slots given by ``row_index`` into R rows.

    Arguments as in :func:`specopd_kernels.losses.tree.tree_alpha`; ``e2e_fkl_is`` also needs ``row_token`` (int64
    ``[R]``, the drafted token sitting at each node row, anything at anchor rows: :attr:`PackedBranches.row_token`)
    and the branches' ``sample_temperature``. ``e2e_fkl_is`` optionally takes greedy-path branches
    (:func:`specopd_kernels.losses.tree._greedy_mix`): ``greedy_branches`` int64 ``[M]`` (which of the N branches
    follow the target's greedy path, e.g. the reference continuation), ``greedy_tokens`` int64 ``[M, G]`` (their
    tokens, -1 past the reference's end) and ``greedy_weight`` lambda. ``draft_opd`` needs ``accepted_mask`` and
    ``rejected_mask`` (bool ``[N, G]``) and takes its hyper-parameters in ``options`` (gamma, lambda_acc,
    lambda_rej, log_prob_min, loss_max, accepted_kl, rejected_kl). Returns an fp32 scalar equal to the flat
    loss on the expanded ``[N, G, V]`` tensors (mean reduction), value and gradient w.r.t. ``draft_logits``.
    Raises KeyError for a name without a tree form (e.g. ``ce_decay``), ValueError on bad shapes or
    indices, a missing ``row_token`` or slot mask, or greedy-path branches for a loss without that term.
    """
    return tree_loss_and_alpha(name, target_rows, draft_logits, row_draft, row_index, with_alpha=False,
                               row_token=row_token, sample_temperature=sample_temperature,
                               greedy_branches=greedy_branches, greedy_tokens=greedy_tokens,
                               greedy_weight=greedy_weight, accepted_mask=accepted_mask,
                               rejected_mask=rejected_mask, options=options)[0]


def tree_loss_and_alpha(name: str, target_rows: torch.Tensor, draft_logits: torch.Tensor, row_draft: torch.Tensor,
                        row_index: torch.Tensor, with_alpha: bool = True, *, row_token: Optional[torch.Tensor] = None,
                        sample_temperature: float = 1.0, greedy_branches: Optional[torch.Tensor] = None,
                        greedy_tokens: Optional[torch.Tensor] = None, greedy_weight: float = 0.5,
                        accepted_mask: Optional[torch.Tensor] = None, rejected_mask: Optional[torch.Tensor] = None,
                        options: Optional[Mapping[str, Any]] = None):
    """``(loss, alpha)``: :func:`tree_loss` and the detached ``[N, G]`` acceptance probabilities (None unless
    ``with_alpha``), dispatched to the registered tree form. For the E2E-TV losses alpha is the loss's own
    intermediate (no second pass over the rows). Errors as in :func:`tree_loss`."""
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None or spec.tree is None:
        raise KeyError(f"loss {name!r} has no proposal-tree form; valid names: "
                       f"{', '.join(tree_losses(slot_masks=True))}")
    if greedy_branches is not None and not spec.greedy_branches:
        with_greedy = " or ".join(n for n, s in _REGISTRY.items() if s.greedy_branches)
        raise ValueError(f"greedy-path branches are a term of {with_greedy}, not of {name!r}")
    return spec.tree(target_rows, draft_logits, row_draft, row_index, with_alpha, row_token=row_token,
                     sample_temperature=sample_temperature, greedy_branches=greedy_branches,
                     greedy_tokens=greedy_tokens, greedy_weight=greedy_weight, accepted_mask=accepted_mask,
                     rejected_mask=rejected_mask, **(options or {}))
