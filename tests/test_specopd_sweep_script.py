"""benchmarks/specopd_sweep.py: arm parsing and the validation prompts (disjoint from eval and SFT prompts)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _sweep():
    spec = importlib.util.spec_from_file_location("specopd_sweep", ROOT / "benchmarks" / "specopd_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_arm():
    sweep = _sweep()
    assert sweep.parse_arm("sft:lr=5e-4") == ("sft", {"lr": 5e-4})
    assert sweep.parse_arm("specopd:A=32,K=16,S=2,lr=1e-3,temp=0.5") == (
        "specopd", {"A": 32, "K": 16, "S": 2, "lr": 1e-3, "temp": 0.5})
    assert sweep.parse_arm("specopd") == ("specopd", {})
    with pytest.raises(ValueError, match="kind must be sft or specopd"):
        sweep.parse_arm("ppo:lr=1")
    with pytest.raises(ValueError, match="unknown key 'K'"):
        sweep.parse_arm("sft:K=4")
    with pytest.raises(ValueError):
        sweep.parse_arm("specopd:A=many")


def test_validation_prompts_are_unseen_by_sft_and_disjoint_from_eval():
    from specopd_trainer.data import load_domain, split
    from specopd_trainer.evaluate import eval_records

    sweep = _sweep()
    val = sweep.validation_records(offset=100, limit=8)
    for d, recs in val.items():
        assert len(recs) == 8
        train, _ = split(load_domain(d), eval_fraction=0.1, seed=0)
        sft_ids = {r["id"] for r in train[:100]}  # the prompts an SFT run with --per-domain 100 regenerates
        ids = {r["id"] for r in recs}
        assert not ids & sft_ids
        assert not ids & {r["id"] for r in eval_records(d)}
