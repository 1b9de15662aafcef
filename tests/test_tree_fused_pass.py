"""The two-pass E2E-KL(-IS) tree loss (:mod:`specopd_kernels.losses.tree_fused_pass`) equals the three-pass
formula it replaced (separate alpha, logsumexp and p log p + P passes), value and gradient."""

import pytest
import torch

from specopd_kernels.losses import acceptance_weights, accepted_prefix_weights
from specopd_kernels.losses.tree import _check_greedy, _e2e_fkl_tree, _greedy_mix, _tree_accept_ratio, tree_alpha
from specopd_kernels.losses.tree_fused_pass import row_stats, weighted_rows
from specopd_trainer.loops.branch_tree import pack_branches


def _three_pass_reference(target_rows, draft_logits, row_draft, row_index, row_token=None, temperature=1.0,
                          greedy=None, chunk=256):
    """The previous ``_e2e_fkl_tree``: alpha (chunked softmax), a logsumexp pass, then log_softmax + P."""
    with torch.no_grad():
        alpha = tree_alpha(target_rows, draft_logits.detach(), row_draft, row_index)
        if row_token is None:
            weights = acceptance_weights(alpha) / alpha.shape[1]
        else:
            ratio = _tree_accept_ratio(target_rows, draft_logits, row_draft, row_index, row_token, temperature, chunk)
            weights = accepted_prefix_weights(alpha, ratio) / alpha.shape[1]
        if greedy is not None:
            weights = _greedy_mix(weights, draft_logits, row_draft, row_index, greedy) * row_index.shape[0]
        w_rows = torch.zeros(target_rows.shape[0]).index_add_(0, row_index.reshape(-1), weights.reshape(-1))
        p_bar = torch.zeros(draft_logits.shape)
        neg_entropy = torch.zeros(())
        for lo in range(0, target_rows.shape[0], chunk):
            lp = torch.log_softmax(target_rows[lo:lo + chunk].float(), dim=-1)
            wp = lp.exp() * w_rows[lo:lo + chunk, None]
            neg_entropy += (wp * lp).sum()
            p_bar.index_add_(0, row_draft[lo:lo + chunk], wp)
    cross = (p_bar * torch.log_softmax(draft_logits.float(), dim=-1)).sum()
    return (neg_entropy - cross) / row_index.shape[0], alpha


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["e2e", "is", "is_greedy"])
@pytest.mark.parametrize("chunk", [1, 3, 32])
def test_two_pass_e2e_fkl_tree_equals_three_pass_formula(dtype, mode, chunk):
    torch.manual_seed(5)
    a, k, g, v = 3, 4, 5, 37
    branches = torch.randint(0, 4, (a, k, g))
    pk = pack_branches(branches, g - 1)
    q = (torch.randn(a * g, v) * 2).requires_grad_()
    p_rows = (torch.randn(pk.row_anchor.numel(), v) * 3).to(dtype)
    rd = pk.row_anchor * g + pk.row_slot
    token = None if mode == "e2e" else pk.row_token
    greedy = None
    if mode == "is_greedy":  # last branch of each anchor follows a "greedy path"; anchor 1's ends early
        tokens = branches[:, -1].clone()
        tokens[1, 3:] = -1
        greedy = _check_greedy(torch.arange(a) * k + k - 1, tokens, 0.3, pk.row_index, v)
    temperature = 0.8 if token is not None else 1.0
    new, alpha_new = _e2e_fkl_tree(p_rows, q, rd, pk.row_index, True, chunk=chunk, row_token=token,
                                   sample_temperature=temperature, greedy=greedy)
    (g_new,) = torch.autograd.grad(new, q)
    old, alpha_old = _three_pass_reference(p_rows, q, rd, pk.row_index, token, temperature, greedy)
    (g_old,) = torch.autograd.grad(old, q)
    torch.testing.assert_close(alpha_new, alpha_old, rtol=1e-5, atol=1e-6)
    assert new.item() == pytest.approx(old.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(g_new, g_old, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [1, 2, 32])
def test_row_stats_and_weighted_rows_match_plain_formulas(chunk):
    """alpha, logsumexp and sum p log p per row, safe for masked (-inf / finfo.min) and large logits; P skips rows
    of weight 0 and equals the plain weighted scatter."""
    torch.manual_seed(6)
    r, nq, v = 7, 3, 50
    x = torch.randn(r, v) * 4
    x[1, :5] = float("-inf")  # masked columns (incl. column 0)
    x[2, 0] = torch.finfo(torch.float32).min
    x[3] += 200.0  # large logits
    q = torch.softmax(torch.randn(nq, v), -1)
    d = torch.randint(nq, (r,))
    alpha, lse, h = row_stats(x, q, d, chunk)
    p = torch.softmax(x, -1)
    lp = torch.log_softmax(x, -1)
    torch.testing.assert_close(alpha, torch.minimum(p, q[d]).sum(-1))
    torch.testing.assert_close(lse, torch.logsumexp(x, -1))
    plogp = torch.where(p > 0, p * lp, torch.zeros(()))
    torch.testing.assert_close(h[[0, 2, 3, 4, 5, 6]], plogp.sum(-1)[[0, 2, 3, 4, 5, 6]])  # row 1: 0 * -inf
    w = torch.rand(r)
    w[[0, 4]] = 0.0
    expect = torch.zeros(nq, v).index_add_(0, d, p * w[:, None])
    torch.testing.assert_close(weighted_rows(x, lse, w, d, nq, chunk), expect)
    xb = x.bfloat16()
    lse_b = row_stats(xb, q, d, chunk)[1]
    torch.testing.assert_close(lse_b, torch.logsumexp(xb.float(), -1))
    torch.testing.assert_close(weighted_rows(xb, lse_b, w, d, nq, chunk),
                               torch.zeros(nq, v).index_add_(0, d, torch.softmax(xb.float(), -1) * w[:, None]))
    assert not weighted_rows(x, lse, torch.zeros(r), d, nq, chunk).any()
