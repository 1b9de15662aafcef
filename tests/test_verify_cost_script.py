"""benchmarks/verify_cost/run.py: the break-even acceptance length derived from a served concurrency result, the timed
forward leaving the KV cache as it found it, and its option checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_benchmark


def test_break_even_is_tau_times_plain_over_speculative(tmp_path: Path) -> None:
    vc = load_benchmark("verify_cost")
    level = {"concurrency": 1, "plain_tokens_per_s": 10.0, "specopd_tokens_per_s": 5.0, "acceptance": {"mean": 1.5}}
    other = {**level, "concurrency": 2, "specopd_tokens_per_s": 50.0}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"git_commit": "abc", "temperatures": {"T0": [other, level]}}))
    got = vc.served_break_even(path)
    # one step emits 1.5 tokens in 1.5 / 5 s = 0.3 s; a plain step takes 0.1 s: 3 plain steps, break even at tau 3
    assert got["step_cost_in_plain_steps"] == pytest.approx(3.0) and got["break_even_tau"] == pytest.approx(3.0)
    assert got["file"] == str(path) and got["git_commit"] == "abc"
    assert vc.served_break_even(tmp_path / "missing.json") is None


def test_forward_ms_crops_the_cache_back_to_the_prefix(monkeypatch) -> None:
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    vc = load_benchmark("verify_cost")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    lengths = []
    real = DynamicCache.crop

    def spy(self, n):
        real(self, n)
        lengths.append(self.get_seq_length())

    monkeypatch.setattr(DynamicCache, "crop", spy)
    assert vc.forward_ms(model, prefix=5, m=3, repeats=2) > 0
    assert lengths == [5, 5, 5]  # warm-up + 2 timed calls, each back to the 5-token prefix
    assert vc.linear_ms(model, 4, 1) > 0 and vc.lm_head_ms(model, 4, 1) > 0


def test_rows_must_include_the_decode_baseline() -> None:
    vc = load_benchmark("verify_cost")
    with pytest.raises(SystemExit) as exc:
        vc.main(["--rows", "2,8"])
    assert exc.value.code == 2
