"""benchmarks/specopd_sweep.py: arm parsing and the validation prompts (disjoint from eval and SFT prompts)."""

from pathlib import Path

import pytest

from _scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _sweep():
    return load_benchmark("specopd_sweep")


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
    from specopd_trainer.data import domain_split
    from specopd_trainer.evaluate import eval_records

    sweep = _sweep()
    val = sweep.validation_records(offset=100, limit=8)
    for d, recs in val.items():
        assert len(recs) == 8
        train, _ = domain_split(d)
        sft_ids = {r["id"] for r in train[:100]}  # the prompts an SFT run with --per-domain 100 regenerates
        ids = {r["id"] for r in recs}
        assert not ids & sft_ids
        assert not ids & {r["id"] for r in eval_records(d)}


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

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "specopd_smollm2.py"
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
    val = _sweep().validation_records(offset=100, limit=8)
    for d, ids in by_domain.items():
        train, _ = domain_split(d)
        assert not ids & {r["id"] for r in train[:100]}
        assert not ids & {r["id"] for r in val[d]}
        assert not ids & {r["id"] for r in eval_records(d)}


def test_sweep_refuses_validation_prompts_inside_the_references(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "specopd_sweep.py"), "--arms", "sft",
                        "--val-offset", "110", "--out", str(tmp_path / "x.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "overlap the training references [108, 168)" in r.stderr


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


def test_drift_script_reads_the_scheduler_rss(monkeypatch):
    """score_trees_drift.scheduler_rss_mb parses ``ps -eo rss,args``: the first sglang::scheduler row in MB, else -1."""
    import subprocess
    from types import SimpleNamespace

    drift = load_benchmark("score_trees_drift")
    table = "  RSS COMMAND\n 4096 python -m pytest\n 3340288 sglang::scheduler_TP0\n 99 sglang::scheduler\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=table))
    assert drift.scheduler_rss_mb() == 3262
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(stdout="  RSS COMMAND\n 4096 python\n"))
    assert drift.scheduler_rss_mb() == -1
