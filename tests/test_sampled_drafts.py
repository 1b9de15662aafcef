"""Sampled draft blocks + lossless chain verification (sglang_specopd.server.sampled_drafts, cpu.chain_sampling)."""

from types import SimpleNamespace

import pytest
import torch

from sglang_specopd.server.cpu.chain_sampling import chain_speculative_sampling
from sglang_specopd.server.sampled_drafts import draft_sampling_mode, sample_block, verify_block


def _run_chain(candidates, target_probs, draft_probs, seed=0):
    bs, n = candidates.shape
    g = torch.Generator().manual_seed(seed)
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32)
    accept_num = torch.empty((bs,), dtype=torch.int32)
    retrive_index = torch.arange(bs * n).view(bs, n)
    chain_speculative_sampling(predicts, accept_index, accept_num, candidates, retrive_index, None, None,
                               torch.rand((bs, n - 1), generator=g), torch.rand((bs,), generator=g),
                               target_probs, draft_probs)
    return predicts, accept_index, accept_num


def test_chain_sampling_hand_cases():
    # V = 3, one block of 2 drafts. q == p (point masses on the drafted tokens): both accepted, bonus from p_2.
    p = torch.tensor([[[0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]]])
    cand = torch.tensor([[2, 1, 2]])
    predicts, idx, num = _run_chain(cand, p, p[:, :2].clone())
    assert num.tolist() == [2]
    assert [int(predicts[int(i)]) for i in idx[0]] == [1, 2, 0]  # drafts 1, 2 then the bonus drawn from p_2
    # q disjoint from p at slot 1: rejected (p(x)=0), the correction comes from norm(max(p - q, 0)) = p_0 = token 1.
    q = torch.tensor([[[1.0, 0, 0], [0, 0, 1.0]]])
    cand = torch.tensor([[2, 0, 2]])
    predicts, idx, num = _run_chain(cand, p, q)
    assert num.tolist() == [0] and int(predicts[int(idx[0, 0])]) == 1


def test_chain_sampling_is_lossless_and_accepts_sum_min():
    """First emitted token ~ p_0 whatever q is; P(accept slot 1) = sum_v min(p_0, q_0) (Leviathan et al. 2023)."""
    torch.manual_seed(0)
    n_rows = 20000
    p0 = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q0 = torch.tensor([0.1, 0.2, 0.3, 0.4])
    p1 = torch.tensor([0.25, 0.25, 0.25, 0.25])
    q1 = torch.tensor([0.7, 0.1, 0.1, 0.1])
    target = torch.stack([p0, p1, p1]).expand(n_rows, 3, 4).contiguous()
    draft = torch.stack([q0, q1]).expand(n_rows, 2, 4).contiguous()
    cand = torch.zeros((n_rows, 3), dtype=torch.int64)
    cand[:, 1] = torch.multinomial(q0, n_rows, replacement=True)
    cand[:, 2] = torch.multinomial(q1, n_rows, replacement=True)
    predicts, idx, num = _run_chain(cand, target, draft, seed=1)
    first = predicts.view(n_rows, 3)[:, 0].long()  # row r's first emitted token sits at flat index r*3 (the root)
    freq = torch.bincount(first, minlength=4).float() / n_rows
    assert torch.allclose(freq, p0, atol=0.015), freq
    alpha0, alpha1 = torch.minimum(p0, q0).sum(), torch.minimum(p1, q1).sum()  # 0.6, 0.55
    assert abs((num >= 1).float().mean() - alpha0) < 0.015
    assert abs((num >= 2).float().mean() - alpha0 * alpha1) < 0.015


def test_chain_sampling_refuses_block_verification():
    with pytest.raises(NotImplementedError, match="block verification"):
        chain_speculative_sampling(*([None] * 11), block_verification=True)


def test_sample_block_temperature_and_greedy_rows():
    torch.manual_seed(0)
    logits = torch.randn(3, 2, 5)
    temps = torch.tensor([[0.5], [1.0], [1.0]])
    greedy = torch.tensor([False, False, True])
    tokens, q = sample_block(logits, temps, greedy)
    assert tokens.shape == (3, 2) and tokens.dtype == torch.int64 and q.dtype == torch.float32
    assert torch.allclose(q[0], torch.softmax(logits[0] / 0.5, -1)) and torch.allclose(q[1], torch.softmax(logits[1], -1))
    assert tokens[2].tolist() == logits[2].argmax(-1).tolist()
    assert torch.equal(q[2], torch.nn.functional.one_hot(logits[2].argmax(-1), 5).float())
    # sampled tokens follow q: a peaked row is (almost) always its argmax, a flat row is not
    peaked = torch.tensor([[[0.0, 30.0, 0.0]]]).expand(400, 1, 3)
    tok, _ = sample_block(peaked, torch.ones(400), torch.zeros(400, dtype=torch.bool))
    assert (tok == 1).all()
    flat = torch.zeros(4000, 1, 3)
    tok, _ = sample_block(flat, torch.ones(4000), torch.zeros(4000, dtype=torch.bool))
    assert torch.allclose(torch.bincount(tok.view(-1), minlength=3).float() / 4000, torch.full((3,), 1 / 3), atol=0.03)
    with pytest.raises(ValueError, match="temperature"):
        sample_block(logits, torch.tensor([0.0, 1.0, 1.0]), torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="gamma"):
        sample_block(logits[0], temps, greedy)


def test_draft_sampling_mode_env(monkeypatch):
    monkeypatch.delenv("SPECOPD_DRAFT_SAMPLING", raising=False)
    assert draft_sampling_mode() == "sample"
    monkeypatch.setenv("SPECOPD_DRAFT_SAMPLING", "Greedy")
    assert draft_sampling_mode() == "greedy"
    monkeypatch.setenv("SPECOPD_DRAFT_SAMPLING", "beam")
    with pytest.raises(ValueError, match="SPECOPD_DRAFT_SAMPLING"):
        draft_sampling_mode()


def test_verify_block_through_sglang_accept_sampling():
    """SGLang's accept_sampling with the CPU chain op: q == p on the drafted path accepts everything; the draft
    q is padded to the target's vocabulary width."""
    pytest.importorskip("sglang")
    from sglang_specopd.server.cpu.chain_sampling import install

    install()
    vocab = 6
    logits = torch.full((2 * 3, vocab + 2), -1e4)  # target vocab wider than q's (padded LM head)
    path = [[4, 1, 3, 5], [0, 2, 2, 1]]  # root, 2 drafts, then the token p puts all mass on after them
    for b, row in enumerate(path):
        for j in range(3):
            logits[b * 3 + j, row[j + 1]] = 0.0
    cand = torch.tensor([row[:3] for row in path])
    q = torch.zeros(2, 2, vocab)
    for b, row in enumerate(path):
        q[b, 0, row[1]] = q[b, 1, row[2]] = 1.0
    info = SimpleNamespace(need_top_k_sampling=False, need_top_p_sampling=False, temperatures=torch.ones(2, 1))
    acc, bonus = verify_block(candidates=cand, target_logits=logits, draft_probs=q, sampling_info=info,
                              draft_input=SimpleNamespace(max_top_k=None, uniform_top_k_value=None))
    assert acc.tolist() == [2, 2] and bonus.tolist() == [5, 1]
