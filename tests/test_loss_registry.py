"""The one loss registry: every name once, its flat and proposal-tree forms side by side, and the flags the
trainer reads (root anchors, bf16 rows, greedy branches); tree_loss dispatches through it."""

from __future__ import annotations

import pytest
import torch

from specopd_kernels.losses import (LOSSES, LossSpec, e2e_fkl_is_loss, e2e_tv_loss, get_loss, get_loss_spec,
                                    register_loss, root_anchor_losses, tree_loss, tree_losses, tv_loss)
from specopd_kernels.losses import registry as reg
from specopd_kernels.losses.tree import tree_e2e_fkl_is, tree_e2e_tv, tree_per_token


def test_each_name_has_its_flat_and_tree_form() -> None:
    assert LOSSES["e2e_tv"].flat is e2e_tv_loss and LOSSES["e2e_tv"].tree is tree_e2e_tv
    assert LOSSES["e2e_fkl_is"].flat is e2e_fkl_is_loss and LOSSES["e2e_fkl_is"].tree is tree_e2e_fkl_is
    assert LOSSES["ce_decay"].tree is None
    assert tree_losses() == ("e2e_tv", "e2e_tv_fused", "e2e_fkl", "e2e_fkl_is", "tv", "fkl", "rkl")
    # draft_opd's tree form needs per-slot accepted / rejected masks: listed only for trainers that have them
    assert LOSSES["draft_opd"].tree is not None and LOSSES["draft_opd"].slot_masks
    assert tree_losses(slot_masks=True) == tree_losses() + ("draft_opd",)
    assert root_anchor_losses() == ("e2e_fkl", "e2e_fkl_is")
    assert [n for n, s in LOSSES.items() if s.greedy_branches] == ["e2e_fkl_is"]
    assert [n for n, s in LOSSES.items() if s.bf16_rows] == ["e2e_fkl", "e2e_fkl_is"]
    assert get_loss_spec("tv").flat is get_loss("tv") is tv_loss
    with pytest.raises(TypeError):
        LOSSES["x"] = LOSSES["tv"]  # read-only view: registration goes through register_loss


def test_registering_a_loss_makes_it_a_tree_and_specopd_loss() -> None:
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig

    with pytest.raises(ValueError, match="already registered"):
        register_loss(LossSpec("tv", tv_loss))
    with pytest.raises(ValueError, match="without a tree form"):
        register_loss(LossSpec("flat_only_bad", tv_loss, root_anchor=True))
    with pytest.raises(ValueError, match="unknown SpecOPD loss 'tv_copy'"):
        SpecOPDConfig(loss="tv_copy")
    register_loss(LossSpec("tv_copy", tv_loss, tree_per_token(tv_loss)))
    try:
        assert SpecOPDConfig(loss="tv_copy").loss == "tv_copy"
        g = torch.Generator().manual_seed(0)
        p, q = torch.randn(5, 11, generator=g), torch.randn(3, 11, generator=g)
        rd, idx = torch.tensor([0, 1, 2, 0, 1]), torch.tensor([[0, 1], [3, 4], [2, 2]])
        want = tree_loss("tv", p, q, rd, idx)
        assert 0 < want.item() < 1 and tree_loss("tv_copy", p, q, rd, idx).item() == pytest.approx(want.item())
    finally:
        reg._REGISTRY.pop("tv_copy")
    assert "tv_copy" not in tree_losses()


def test_dispatch_refuses_flat_only_names_and_foreign_greedy_branches() -> None:
    p = torch.zeros(2, 3)
    with pytest.raises(KeyError, match="no proposal-tree form; valid names: e2e_tv, e2e_tv_fused"):
        tree_loss("ce_decay", p, p, torch.arange(2), torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="needs accepted_mask"):
        tree_loss("draft_opd", p, p, torch.arange(2), torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="greedy-path branches are a term of e2e_fkl_is, not of 'e2e_tv'"):
        tree_loss("e2e_tv", p, p, torch.arange(2), torch.tensor([[0, 1], [1, 0]]),
                  greedy_branches=torch.tensor([0]), greedy_tokens=torch.zeros(1, 2, dtype=torch.long))
