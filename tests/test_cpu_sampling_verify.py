"""CPU adaptation 7: the torch ``tree_speculative_sampling_target_only`` (lossless chain speculative sampling)."""

from __future__ import annotations

import torch

from sglang_specopd.server.cpu.sampling_verify import tree_speculative_sampling_target_only


def _run(candidates, target_probs, coins, final):
    bs, n = candidates.shape
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    r_index = torch.arange(bs * n).view(bs, n)
    r_next = torch.arange(1, n + 1).repeat(bs, 1)
    r_next[:, -1] = -1
    tree_speculative_sampling_target_only(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
        retrive_index=r_index, retrive_next_token=r_next, retrive_next_sibling=torch.full((bs, n), -1),
        uniform_samples=coins, uniform_samples_for_final_sampling=final, target_probs=target_probs,
        draft_probs=torch.zeros_like(target_probs))
    return predicts, accept_index, accept_num


def test_hand_case_accept_then_reject_and_resample():
    # slot 0 row: p(x1=1) = 0.6, coin 0.5 <= 0.6 -> accept; slot 1 row: p(x2=2) = 0.1, coin 0.5 -> reject;
    # final token from relu(p1 - p1(2) e_2) = [0.7, 0.1, 0, 0.1]: u = 0.95 * 0.9 = 0.855 -> cdf [.7,.8,.8,.9] -> 3
    p = torch.tensor([[[0.1, 0.6, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]])
    predicts, accept_index, n = _run(torch.tensor([[0, 1, 2]]), p, torch.tensor([[0.5, 0.5, 0.5]]),
                                     torch.tensor([0.95]))
    assert n.tolist() == [1]
    assert accept_index[0, :2].tolist() == [0, 1]
    assert predicts[0].item() == 1 and predicts[1].item() == 3


def test_first_emitted_token_follows_the_target_distribution():
    """Lossless: with a point-mass draft, the first emitted token is distributed as the target's p."""
    torch.manual_seed(0)
    p0 = torch.tensor([0.1, 0.5, 0.3, 0.1])
    p = torch.stack([p0, torch.full((4,), 0.25)])[None]
    counts = torch.zeros(4)
    trials = 3000
    coins = torch.rand(trials, 2)
    finals = torch.rand(trials)
    for t in range(trials):
        predicts, _, n = _run(torch.tensor([[0, 1]]), p, coins[t : t + 1], finals[t : t + 1])
        counts[predicts[0].item()] += 1
    freq = counts / trials
    assert torch.allclose(freq, p0, atol=0.03), freq
