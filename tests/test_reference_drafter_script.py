"""benchmarks/reference_drafter/run.py: corpus records, the stable walk-tau hold-out and the plateau curve."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _scripts import load_benchmark


def test_holdout_is_stable_as_the_corpus_grows_and_capped() -> None:
    rd = load_benchmark("reference_drafter")
    small = [f"x/{i}" for i in range(500)]
    big = small + [f"y/{i}" for i in range(500)]
    h_small, h_big = rd.holdout_ids(small, fraction=0.05, cap=1000), rd.holdout_ids(big, fraction=0.05, cap=1000)
    assert 10 <= len(h_small) <= 45
    assert h_small <= h_big  # growing the corpus never moves a held-out sequence back into training
    assert len(rd.holdout_ids(big, fraction=0.05, cap=7)) == 7


def test_plateau_keeps_each_new_walk_tau_once(tmp_path: Path) -> None:
    rd = load_benchmark("reference_drafter")
    (tmp_path / "sft").mkdir()
    rows = [{"step": 1, "loss": 9.0, "eval_walk_tau": float("nan")},
            {"step": 200, "loss": 5.0, "eval_walk_tau": 1.2}, {"step": 201, "loss": 5.0, "eval_walk_tau": 1.2},
            {"step": 400, "loss": 4.0, "eval_walk_tau": 1.3}]
    (tmp_path / "sft" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rd.plateau(tmp_path) == [{"step": 200, "walk_tau": 1.2, "loss": 5.0},
                                    {"step": 400, "walk_tau": 1.3, "loss": 4.0}]
    assert rd.plateau(tmp_path / "missing") == []


def test_corpus_interleaves_domains_samples_scarce_ones_and_excludes_held_out() -> None:
    from specopd_trainer.data import domain_split
    from specopd_trainer.data.corpus import CorpusSpec, corpus_records, corpus_size

    spec = CorpusSpec(samples={"dialogue": 3, "coding": 1, "math": 1, "agentic": 0}, math_problems=200)
    recs = list(corpus_records(spec))
    assert [r["domain"] for r in recs[:6]] == ["dialogue", "coding", "math", "dialogue", "coding", "math"]
    sizes = corpus_size(spec)
    assert sizes["agentic"] == 0 and sizes["dialogue"] == 3 * len(domain_split("dialogue")[0])
    assert len(recs) == sum(sizes.values()) and len({r["id"] for r in recs}) == len(recs)
    extra = [r for r in recs if "#s" in r["id"]]
    assert extra and all(r["temperature"] == 0.8 and r["sampling_seed"] in (1, 2) for r in extra)
    assert all("temperature" not in r for r in recs if "#s" not in r["id"])
    held = {r["id"] for d in ("dialogue", "coding", "math") for r in domain_split(d, limit=200 if d == "math"
                                                                                   else None)[1]}
    assert not held & {r["id"].split("#")[0] for r in recs}
    # the benchmark's held-out math problems (first 1000 generated) stay held out in a bigger corpus
    bench_held = {r["id"] for r in domain_split("math")[1]}
    big = {r["id"] for r in corpus_records(CorpusSpec(samples={"math": 1}, math_problems=3000))}
    assert not bench_held & big


def test_snapshot_stage_adds_a_shard_of_new_responses_only(tmp_path: Path, monkeypatch, capsys) -> None:
    from specopd_trainer.data.snapshot import iter_snapshot

    rd = load_benchmark("reference_drafter")
    monkeypatch.setattr(rd, "SNAPSHOT", tmp_path / "snap")
    data = tmp_path / "run" / "data"
    data.mkdir(parents=True)
    rec = {"id": "math-1", "domain": "math", "prompt_ids": [1, 2], "response_ids": [3, 4, 5], "finish_reason": "stop"}
    (data / "responses.jsonl").write_text(json.dumps(rec) + "\n")
    assert rd.main(["snapshot", "--run-dir", str(tmp_path / "run")]) == 0
    assert "responses-000.jsonl.gz" in capsys.readouterr().err
    assert [r["id"] for r in iter_snapshot(tmp_path / "snap")] == ["math-1"]
    assert rd.main(["snapshot", "--run-dir", str(tmp_path / "run")]) == 0
    assert "nothing new" in capsys.readouterr().err


def test_ship_copies_the_reported_drafter_in_bf16_with_its_record(tmp_path: Path, monkeypatch, tiny_target: Path,
                                                                  tiny_drafter: Path) -> None:
    import shutil

    import torch
    from safetensors.torch import load_file

    import sglang_specopd.app.models as models
    import sglang_specopd.app.drafters.reference as refs
    from sglang_specopd.app.drafters.check import check_drafter

    rd = load_benchmark("reference_drafter")
    results, assets = tmp_path / "results", tmp_path / "assets"
    results.mkdir()
    monkeypatch.setattr(rd, "RESULTS", results)
    monkeypatch.setattr(refs, "ASSETS_DIR", assets)
    monkeypatch.setattr(models, "prepare_model", lambda name: tiny_target)
    src = tmp_path / "run" / "drafter-sft"
    shutil.copytree(tiny_drafter, src)
    measured = {"target": "tiny", "steps": 400, "train_tokens": 1234, "train_sequences": 9,
                "acceptance": {"T0": {"mean": 1.9, "ci95": [1.8, 2.0]}, "T1": {"mean": 1.7, "ci95": [1.6, 1.8]}},
                "drafter": {"sha256": "0" * 64}}
    (results / "reference_drafter_smollm2_cpu.json").write_text(json.dumps(measured))
    (results / "reference_corpus_smollm2_cpu.json").write_text(json.dumps({"response_tokens": 5000}))
    args = argparse.Namespace(run_dir=str(tmp_path / "run"), drafter=None)
    assert rd.ship(args) == 2 and not assets.exists()  # the result file measured another drafter

    measured["drafter"]["sha256"] = rd._sha256(src / "model.safetensors")
    (results / "reference_drafter_smollm2_cpu.json").write_text(json.dumps(measured))
    assert rd.ship(args) == 0
    dest = assets / refs.reference_drafter_name(tiny_target, 4)
    assert check_drafter(dest, tiny_target) == []
    shipped, source = load_file(str(dest / "model.safetensors")), load_file(str(src / "model.safetensors"))
    assert shipped.keys() == source.keys() and all(t.dtype == torch.bfloat16 for t in shipped.values())
    assert all(torch.equal(shipped[k], source[k].to(torch.bfloat16)) for k in source)
    record = json.loads((dest / refs.RECORD).read_text())
    assert record["steps"] == 400 and record["served_tau"]["T0"] == {"mean": 1.9, "ci95": [1.8, 2.0]}
    assert record["data"]["response_tokens"] == 5000 and record["source_sha256_float32"] == measured["drafter"]["sha256"]
    assert json.loads((dest / "config.json").read_text())["dtype"] == "bfloat16"
    assert not dest.with_name(dest.name + ".tmp").exists()
    # the trained steps come from the SFT run's newest checkpoint, the sft command from its corpus.json
    (tmp_path / "run" / "sft" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "sft" / "checkpoints" / "step-0000450.pt").write_bytes(b"")
    (tmp_path / "run" / "sft" / "corpus.json").write_text(json.dumps({"sft_command": "python x.py sft --steps 500"}))
    assert rd.ship(args) == 0
    record = json.loads((dest / refs.RECORD).read_text())
    assert record["steps"] == 450 and "python x.py sft --steps 500" in record["reproduce"]
