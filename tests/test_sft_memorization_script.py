"""benchmarks/sft_memorization.py: the first-slot fit statistics on a case whose answers are known."""

from types import SimpleNamespace

import pytest
import torch

from _scripts import load_benchmark
from _sft_fixture import tiny_drafter, tiny_sequences


def _script():
    return load_benchmark("sft_memorization")


class _Target:
    """A stand-in target whose next-token logits are given per position: ``fn(token_ids [L]) -> [L, V]``."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, ids):
        return SimpleNamespace(logits=self.fn(ids[0])[None])


def test_first_slot_fit_is_one_when_the_target_is_the_drafter():
    """If the target's next-token distribution at every anchor IS the drafter's first-slot q, alpha_1 = 1, the
    argmax agrees everywhere and p(argmax q) = max q."""
    mod = _script()
    drafter, seqs = tiny_drafter(), tiny_sequences(2)

    def same_as_drafter(ids):
        s = next(x for x in seqs if torch.equal(x.token_ids, ids))
        anchors = torch.arange(s.prompt_len - 1, len(ids) - 1)
        out = torch.zeros(len(ids), 97)
        with torch.no_grad():
            out[anchors] = drafter.logits(s.features.float(), s.token_ids, anchors)[0][:, 1].float()
        return out

    fit = mod.first_slot_fit(drafter, _Target(same_as_drafter), seqs, anchors_per_seq=5)
    assert fit["alpha_1"] == pytest.approx(1.0, abs=1e-5) and fit["argmax_agree"] == 1.0
    assert fit["sequences"] == 2 and fit["anchors"] == 10
    assert 0.0 < fit["p_argmax_q"] <= 1.0


def test_first_slot_fit_on_a_one_hot_target_at_the_reference_token():
    """A target that puts all mass on the reference's next token: the reference is its greedy token everywhere,
    alpha_1 = q_1(reference token) and p(argmax q) = 1[argmax q == reference token]."""
    mod = _script()
    drafter, seqs = tiny_drafter(), tiny_sequences(2)

    def one_hot_next(ids):
        out = torch.full((len(ids), 97), -1e4)
        out[torch.arange(len(ids) - 1), ids[1:]] = 0.0
        return out

    fit = mod.first_slot_fit(drafter, _Target(one_hot_next), seqs, anchors_per_seq=6)
    assert fit["reference_is_target_greedy"] == 1.0
    assert fit["p_argmax_q"] == pytest.approx(fit["argmax_agree"])
    assert 0.0 <= fit["alpha_1"] < 1.0
