"""E2E-KL (kernels/specopd_kernels/losses/e2e_kl.py): acceptance weights and the weighted forward KL, hand-checked."""

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


def test_accepted_prefix_weights_hand_case():
    # G = 3: c_is = (1 * (1 + a2 + a2 a3), r1 * (1 + a3), r1 r2)
    from specopd_kernels.losses import accepted_prefix_weights

    a1, a2, a3, r1, r2 = 0.5, 0.4, 0.25, 0.9, 0.1
    c = accepted_prefix_weights(torch.tensor([[a1, a2, a3]]), torch.tensor([[r1, r2]]))
    torch.testing.assert_close(c, torch.tensor([[1 + a2 + a2 * a3, r1 * (1 + a3), r1 * r2]]))
    # with r = alpha upstream it is E2E's acceptance weight exactly
    alpha = torch.tensor([[a1, a2, a3], [0.3, 0.0, 0.7]])
    torch.testing.assert_close(accepted_prefix_weights(alpha, alpha[:, :2]), acceptance_weights(alpha))
    # a rejected-for-sure token (r = 0) removes every later slot of that branch
    torch.testing.assert_close(accepted_prefix_weights(torch.tensor([[a1, a2, a3]]), torch.tensor([[0.0, 1.0]])),
                               torch.tensor([[1 + a2 + a2 * a3, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="accept_ratio must be"):
        accepted_prefix_weights(alpha, alpha[:, :1])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        accepted_prefix_weights(alpha, torch.tensor([[1.5, 0.0], [0.0, 0.0]]))


def test_accepted_prefix_weight_is_the_served_reach_probability():
    """Summed over every slot-1 draft x weighted by q(x), r(x) * f(x) = sum_x min(p, q)(x) f(x): the slot-2 weight
    puts each prefix at the probability that lossless speculative sampling drafts AND accepts it (brute force,
    V = 3), while E2E's alpha_1 weight spreads it as q."""
    from specopd_kernels.losses import draft_accept_ratio

    p1 = torch.tensor([0.7, 0.2, 0.1])
    z1 = torch.tensor([0.0, 1.0, 0.5])  # q1 = softmax(z1), mostly on a token the target rarely emits
    q1 = torch.softmax(z1, -1)
    f = torch.tensor([0.9, 0.1, 0.4])  # any per-prefix slot-2 quantity (e.g. alpha_2 given x_1)
    r = draft_accept_ratio(p1.log().expand(3, 3), z1.expand(3, 3), torch.arange(3))
    served = (torch.minimum(p1, q1) * f).sum()
    assert (q1 * r * f).sum().item() == pytest.approx(served.item(), rel=1e-6)
    alpha1 = torch.minimum(p1, q1).sum()
    assert (q1 * r).sum().item() == pytest.approx(alpha1.item(), rel=1e-6)  # same total weight as E2E
    assert abs((alpha1 * (q1 * f).sum()).item() - served.item()) > 0.05  # but E2E's spread differs here
    # sampling temperature: the ratio uses the law the token was drawn from, softmax(z / T)
    r_t = draft_accept_ratio(p1.log()[None], z1[None], torch.tensor([1]), temperature=0.5)
    assert r_t.item() == pytest.approx(min(1.0, 0.2 / torch.softmax(z1 / 0.5, -1)[1].item()), rel=1e-6)


def test_e2e_fkl_is_hand_case_value_and_gradient():
    # V = 2, G = 2, one branch whose slot-1 draft is token 0: p1 = (1/2, 1/2), q1 = (3/4, 1/4) -> r1 = 2/3
    from specopd_kernels.losses import e2e_fkl_is_loss

    p = torch.zeros(1, 2, 2)
    q = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0]]], requires_grad=True)
    tokens = torch.tensor([[0, 1]])
    loss = e2e_fkl_is_loss(p, q, tokens)
    a2, r1 = 1.0, (0.5 / 0.75)
    c1, c2 = 1 + a2, r1
    kl1 = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert loss.item() == pytest.approx((c1 * kl1 + c2 * 0.0) / 2, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, q)
    torch.testing.assert_close(grad, torch.tensor([[[c1 / 2 * 0.25, -c1 / 2 * 0.25], [0.0, 0.0]]]))
    # the slot-1 draft token 1 is under-proposed (q 1/4 < p 1/2): r1 = 1, so slot 2 weighs 1
    q2 = torch.tensor([[[math.log(3.0), 0.0], [0.0, math.log(2.0)]]])
    w1 = e2e_fkl_is_loss(p, q2, torch.tensor([[1, 0]])) - e2e_fkl_is_loss(p, q2, torch.tensor([[0, 0]]))
    kl2 = 0.5 * math.log(0.5 / (1 / 3)) + 0.5 * math.log(0.5 / (2 / 3))
    assert w1.item() == pytest.approx((1 - r1) * kl2 / 2, rel=1e-5)
    assert get_loss("e2e_fkl_is") is e2e_fkl_is_loss
    with pytest.raises(ValueError, match="tokens must be int64"):
        e2e_fkl_is_loss(p, q, tokens[:, :1])
