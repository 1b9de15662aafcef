"""benchmarks/specopd_smollm2/run.py and benchmarks/specopd_throughput/run.py: setting parsing, whole scored batches,
root anchors, and the training references (disjoint from the SFT, validation and eval prompts)."""

from pathlib import Path

import pytest

from _scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _sweep():
    return load_benchmark("specopd_throughput")  # parse_arm / SPECOPD_KEYS: its --settings syntax


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


def test_parse_arm_greedy_branch_flag():
    sweep = _sweep()
    assert sweep.parse_arm("specopd:K=8,greedy=1") == ("specopd", {"K": 8, "greedy": True})
    assert sweep.parse_arm("specopd:greedy=0") == ("specopd", {"greedy": False})
    assert sweep.SPECOPD_KEYS["greedy"] == "greedy_branch"
    assert sweep.parse_arm("specopd:loss=fkl") == ("specopd", {"loss": "fkl"})
    assert sweep.parse_arm("specopd:M=4,dtype=float32") == ("specopd", {"M": 4, "dtype": "float32"})
    assert (sweep.SPECOPD_KEYS["M"], sweep.SPECOPD_KEYS["dtype"]) == ("minibatches", "compute_dtype")


def test_specopd_config_buys_whole_scored_batches():
    """The comparison's SpecOPD arm: steps = the budget / supervised tokens per step, rounded to whole scored
    batches of ``minibatches`` steps."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "specopd_smollm2" / "run.py"
    spec = importlib.util.spec_from_file_location("specopd_smollm2_cfg", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kw = dict(anchors_per_seq=8, branches=7, seqs_per_step=2, lr=1e-3, loss="e2e_fkl_is", root_anchors=64)
    one = mod.specopd_config(229376, 7, **kw)  # 912 tokens per step -> 251.5 steps
    four = mod.specopd_config(229376, 7, minibatches=4, **kw)
    assert (one.steps, one.minibatches) == (252, 1) and (four.steps, four.minibatches) == (252, 4)
    assert mod.specopd_config(229376, 7, minibatches=5, **kw).steps == 250
    assert four.compute_dtype == "float32"


def test_fresh_references_are_disjoint_from_sft_validation_and_eval_prompts():
    """The comparison's training references (offset 108) overlap neither the SFT start's prompts (first 100 per
    domain), the validation prompts (100..107) nor the eval split; dialogue has 131 train prompts (16% held out), so 23."""
    from specopd_trainer.data import domain_split
    from specopd_trainer.evaluate import eval_records
    from specopd_trainer.pipeline import train_split_records

    refs = train_split_records(offset=108, per_domain=60)
    by_domain = {}
    for r in refs:
        by_domain.setdefault(r["domain"], set()).add(r["id"])
    assert {d: len(v) for d, v in by_domain.items()} == {"dialogue": 23, "coding": 60, "math": 60, "agentic": 60}
    from specopd_trainer.pipeline import train_split_records as records

    val = {d: records(100, 8, [d]) for d in by_domain}  # the validation prompts (train split 100..107)
    for d, ids in by_domain.items():
        train, _ = domain_split(d)
        assert not ids & {r["id"] for r in train[:100]}
        assert not ids & {r["id"] for r in val[d]}
        assert not ids & {r["id"] for r in eval_records(d)}


def test_root_anchor_key_and_budget_accounting():
    """R= is the root anchors per sequence; the comparison's step count charges them one supervised token each."""
    sweep = _sweep()
    assert sweep.parse_arm("specopd:A=8,K=7,S=2,R=64,loss=e2e_fkl_is") == (
        "specopd", {"A": 8, "K": 7, "S": 2, "R": 64, "loss": "e2e_fkl_is"})
    comparison = load_benchmark("specopd_smollm2")
    cfg = comparison.specopd_config(229376, 7, anchors_per_seq=8, branches=7, seqs_per_step=2, lr=1e-3,
                                    loss="e2e_fkl_is", root_anchors=64)
    assert cfg.root_anchors_per_seq == 64 and cfg.steps == round(229376 / (2 * (8 * 7 * 7 + 64))) == 252
    plain = comparison.specopd_config(229376, 7, anchors_per_seq=8, branches=7, seqs_per_step=2, lr=1e-3,
                                      loss="e2e_fkl_is")
    assert plain.steps == round(229376 / (2 * 8 * 7 * 7)) == 293
    with pytest.raises(ValueError, match="root_anchors_per_seq > 0 needs loss"):
        comparison.specopd_config(229376, 7, anchors_per_seq=8, branches=7, seqs_per_step=2, lr=1e-3,
                                  loss="e2e_tv", root_anchors=64)


def test_throughput_script_rejects_a_bad_setting_before_starting_anything():
    throughput = load_benchmark("specopd_throughput")
    with pytest.raises(ValueError, match="unknown key 'Z'"):
        throughput.main(["--settings", "A=8,Z=1"])
