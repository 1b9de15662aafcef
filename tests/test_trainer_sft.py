"""SFT loop: it learns, resume is exact, and DDP with 2 gloo ranks keeps the replicas identical."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

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
