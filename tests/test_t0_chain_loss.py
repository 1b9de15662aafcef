"""The T=0-aligned loss (``t0_chain_ce``): hard CE weighted by the drafter's argmax chain, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from specopd_kernels.losses import LOSSES, get_loss
from specopd_kernels.losses.t0_chain import t0_chain_ce_loss, t0_chain_weights


def _ce(row, y):
    return -(row[y] - math.log(sum(math.exp(x) for x in row)))


def test_hand_checked_weights_and_value():
    # block 1: slot 1 argmax 0 = y 0 (hit), slot 2 argmax 1 != y 0 (miss), slot 3 unreachable
    # block 2: slot 1 argmax 1 != y 0 (miss): only slot 1 counts
    rows = [[[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]], [[0.0, 2.0], [1.0, 0.0], [1.0, 0.0]]]
    logits = torch.tensor(rows, requires_grad=True)
    labels = torch.tensor([[0, 0, 1], [0, 0, 0]])
    assert t0_chain_weights(logits, labels).tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    want = (_ce(rows[0][0], 0) + _ce(rows[0][1], 0) + _ce(rows[1][0], 0)) / 3
    got = t0_chain_ce_loss(logits, labels)
    assert got.item() == pytest.approx(want, rel=1e-6)  # (0.1269 + 1.3133 + 2.1269) / 3 = 1.1890
    assert got.item() == pytest.approx(1.18903, abs=1e-4)
    got.backward()
    assert logits.grad[0, 2].abs().sum().item() == 0 and logits.grad[1, 1:].abs().sum().item() == 0  # unreached
    # the reached slot's gradient is (softmax - onehot) / 3
    p = torch.softmax(torch.tensor(rows[1][0]), -1)
    assert logits.grad[1, 0].tolist() == pytest.approx(((p - torch.tensor([1.0, 0.0])) / 3).tolist(), abs=1e-6)


def test_ignored_labels_end_the_chain_and_all_hits_weigh_every_slot():
    logits = torch.tensor([[[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]]])
    assert t0_chain_weights(logits, torch.tensor([[0, 1, 0]])).tolist() == [[1.0, 1.0, 1.0]]
    assert t0_chain_weights(logits, torch.tensor([[0, -100, 0]])).tolist() == [[1.0, 0.0, 0.0]]
    want = _ce([5.0, 0.0], 0)
    assert t0_chain_ce_loss(logits, torch.tensor([[0, -100, 0]])).item() == pytest.approx(want, rel=1e-6)
    assert t0_chain_ce_loss(logits, torch.full((1, 3), -100)).item() == 0.0  # nothing reached: 0


def test_registered_flat_only_and_refuses_bad_input():
    assert LOSSES["t0_chain_ce"].tree is None and get_loss("t0_chain_ce") is t0_chain_ce_loss
    with pytest.raises(ValueError, match="labels must lie"):
        t0_chain_ce_loss(torch.zeros(1, 2, 3), torch.tensor([[0, 7]]))
    with pytest.raises(ValueError, match="labels shape"):
        t0_chain_ce_loss(torch.zeros(1, 2, 3), torch.tensor([[0]]))
    with pytest.raises(TypeError):
        t0_chain_ce_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2))
