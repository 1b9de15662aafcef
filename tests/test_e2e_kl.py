"""E2E-KL (kernels/losses/e2e_kl.py): acceptance weights and the weighted forward KL, hand-checked."""

import math

import pytest
import torch

from specopd_kernels.losses import acceptance_weights, e2e_fkl_loss, forward_kl, get_loss


def test_acceptance_weights_hand_case():
    # G = 3, alpha = (a1, a2, a3): E[A] = a1 + a1 a2 + a1 a2 a3
    a1, a2, a3 = 0.5, 0.4, 0.25
    c = acceptance_weights(torch.tensor([[a1, a2, a3]]))
    expected = [1 + a2 + a2 * a3, a1 + a1 * a3, a1 * a2]
    torch.testing.assert_close(c, torch.tensor([expected]))
    # a zero alpha: d/d alpha_1 still sees the chain after it; slots after the zero get weight 0
    c0 = acceptance_weights(torch.tensor([[0.0, 0.5, 0.5]]))
    torch.testing.assert_close(c0, torch.tensor([[1 + 0.5 + 0.25, 0.0, 0.0]]))
    # invalid slots weigh nothing and end the chain
    cm = acceptance_weights(torch.tensor([[a1, a2, a3]]), torch.tensor([[True, True, False]]))
    torch.testing.assert_close(cm, torch.tensor([[1 + a2, a1, 0.0]]))


def test_e2e_fkl_hand_case_value_and_gradient():
    # V = 2, G = 2, one block. p = (0.5, 0.5) at both slots; q1 = (1, 0)-ish via logits, q2 uniform.
    p = torch.zeros(1, 2, 2)  # uniform target
    q = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0]]], requires_grad=True)  # q1 = (3/4, 1/4), q2 = (1/2, 1/2)
    loss = e2e_fkl_loss(p, q)
    a1, a2 = 0.75, 1.0  # sum_v min(p, q): 0.5 + 0.25, 1
    c1, c2 = 1 + a2, a1
    kl1 = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert loss.item() == pytest.approx((c1 * kl1 + c2 * 0.0) / 2, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, q)
    # d KL(p||softmax(z)) / dz = q - p, times the detached weight c_i / G
    expected = torch.tensor([[[c1 / 2 * (0.75 - 0.5), c1 / 2 * (0.25 - 0.5)], [0.0, 0.0]]])
    torch.testing.assert_close(grad, expected)
    assert get_loss("e2e_fkl") is e2e_fkl_loss


def test_e2e_fkl_is_weighted_fkl_and_zero_at_q_equal_p():
    torch.manual_seed(0)
    p = torch.randn(4, 3, 7)
    assert e2e_fkl_loss(p, p.clone()).item() == pytest.approx(0.0, abs=1e-6)
    q = torch.randn(4, 3, 7)
    # with every weight replaced by 1 it would be G x the mean per-token FKL: check it is strictly between
    kl = forward_kl(p, q, reduction="none")
    loss = e2e_fkl_loss(p, q)
    assert 0 < loss.item() < kl.sum(dim=1).mean().item() * 3
    with pytest.raises(ValueError, match="shape mismatch"):
        e2e_fkl_loss(p, q[:, :2])
