"""SFT loop: it learns, resume is exact, and DDP with 2 gloo ranks keeps the replicas identical."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _sft_fixture import tiny_drafter, tiny_sequences
from specopd_trainer.algorithms.sft.config import SFTConfig
from specopd_trainer.algorithms.sft.loop import train_sft


def _losses(run_dir: Path):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _cfg(steps: int, **kw) -> SFTConfig:
    base = dict(steps=steps, seqs_per_step=2, anchors_per_seq=4, log_every=1, ckpt_every=1, warmup_steps=1,
                lr=3e-3)
    base.update(kw)
    return SFTConfig(**base)


def test_loss_decreases(tmp_path):
    torch.manual_seed(0)
    d = tiny_drafter()
    train_sft(d, tiny_sequences(), [], tmp_path / "run", _cfg(40, ckpt_every=100), progress=False)
    losses = _losses(tmp_path / "run")
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_resume_gives_the_same_next_step_loss(tmp_path):
    seqs = tiny_sequences()
    straight = tiny_drafter()
    train_sft(straight, seqs, [], tmp_path / "a", _cfg(4), progress=False)
    interrupted = tiny_drafter()
    train_sft(interrupted, seqs, [], tmp_path / "b", _cfg(2), progress=False)  # "crash" after step 2
    resumed = tiny_drafter(seed=99)  # different init: everything must come from the checkpoint
    train_sft(resumed, seqs, [], tmp_path / "b", _cfg(4), progress=False)
    a, b = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert len(b) == 4
    assert b[2] == a[2] and b[3] == a[3]  # bit-identical next-step losses after resume
    for (na, pa), (nb, pb) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert na == nb and torch.equal(pa, pb), na


def test_checkpoint_is_atomic_and_latest_points_to_newest(tmp_path):
    d = tiny_drafter()
    train_sft(d, tiny_sequences(), [], tmp_path / "run", _cfg(3), progress=False)
    ckpt = tmp_path / "run" / "checkpoints"
    assert (ckpt / "latest").read_text() == "step-0000003.pt"
    assert sorted(p.name for p in ckpt.glob("step-*.pt")) == ["step-0000002.pt", "step-0000003.pt"]
    assert not list(ckpt.glob(".*tmp"))


@pytest.mark.slow
def test_ddp_two_gloo_ranks(tmp_path):
    worker = Path(__file__).with_name("_ddp_sft_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker), str(tmp_path)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
    assert math.isfinite(r0["loss"]) and math.isfinite(r1["loss"])
    assert r0["first"] == r1["first"] and r0["checksum"] == r1["checksum"]  # all-reduced: identical replicas
    single = tiny_drafter()
    flat = torch.cat([p.detach().flatten() for p in single.parameters()])
    assert r0["first"] != flat[:8].tolist()  # and they did train


_KILLED_RUN = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from _sft_fixture import tiny_drafter, tiny_sequences
from specopd_trainer.algorithms.sft.config import SFTConfig
from specopd_trainer.algorithms.sft.loop import train_sft
from specopd_trainer.loops import engine

class KillAt(engine.TrainProgress):
    def update(self, step, wall, postfix):  # after step's metrics row, before its next checkpoint
        if step == {kill_at}:
            with open(os.path.join({run!r}, "metrics.jsonl"), "a") as fh:
                fh.write('{{"step": {next_step}, "loss": 0.')  # and a row cut mid-write
                fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)

engine.TrainProgress = KillAt
cfg = SFTConfig(steps={steps}, seqs_per_step=2, anchors_per_seq=4, log_every=1, ckpt_every=2, warmup_steps=1, lr=3e-3)
train_sft(tiny_drafter(), tiny_sequences(), [], {run!r}, cfg, progress=False)
"""


def _rows(run_dir: Path):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_kill_9_then_resume_leaves_one_metrics_row_per_step(tmp_path):
    """kill -9 after step 3's metrics row (checkpoint of step 2), with a half-written row after it: the resumed run
    logs steps 3.. again, and metrics.jsonl / metrics.csv end with exactly one row per step, the straight run's."""
    from specopd_trainer.loops.engine import write_metrics_csv

    seqs = tiny_sequences()
    train_sft(tiny_drafter(), seqs, [], tmp_path / "straight", _cfg(5, ckpt_every=2), progress=False)
    run = tmp_path / "killed"
    script = _KILLED_RUN.format(tests=str(Path(__file__).parent), run=str(run), kill_at=3, next_step=4, steps=5)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (run / "checkpoints" / "latest").read_text() == "step-0000002.pt"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["step"] for l in lines[:-1]] == [1, 2, 3] and lines[-1].startswith('{"step": 4')
    (run / "metrics.csv").write_text("stale\n")  # as left by an earlier finished call on this run directory
    train_sft(tiny_drafter(seed=99), seqs, [], run, _cfg(5, ckpt_every=2), progress=False)
    write_metrics_csv(run)
    straight, resumed = _rows(tmp_path / "straight"), _rows(run)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight], "bit-exact resume"
    with open(run / "metrics.csv", newline="") as fh:
        csv_rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in csv_rows] == [1, 2, 3, 4, 5]
    assert [float(r["loss"]) for r in csv_rows] == [r["loss"] for r in straight]


def test_resume_rewrites_a_stale_csv_and_a_fresh_start_drops_orphan_rows(tmp_path):
    """A crash before the first checkpoint leaves rows but no checkpoint: the fresh start keeps none of them. A
    metrics.csv left beside truncated rows is rewritten from the kept rows (atomically, no temp file left)."""
    from specopd_trainer.loops.engine import resume_metrics, write_metrics_csv

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3)))
    write_metrics_csv(run)
    resume_metrics(run, 2)
    assert [r["step"] for r in _rows(run)] == [1, 2]
    assert (run / "metrics.csv").read_text().splitlines()[1:] == ["0.1,1", "0.2,2"]
    assert sorted(p.name for p in run.iterdir()) == ["metrics.csv", "metrics.jsonl"]
    train_sft(tiny_drafter(), tiny_sequences(), [], run, _cfg(2, ckpt_every=5), progress=False)
    assert [r["step"] for r in _rows(run)] == [1, 2], "the orphan rows of a run without checkpoint are dropped"
