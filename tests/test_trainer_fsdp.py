"""FSDP2 (``parallel: fsdp2``, 2 gloo ranks on CPU) is the single-process run, sharded: same loss curve and weights
(fp32, within 1e-5) after 20 SFT steps on the tiny drafter, the same global batch split across ranks; a crash and
resume under FSDP2 ends where the uninterrupted run does; checkpoints move between FSDP2 and one process both ways.
No server: SFT on the synthetic sequences of ``_sft_fixture``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _fsdp_sft_worker import cfg, crash_at
from _sft_fixture import tiny_drafter, tiny_sequences
from specopd_trainer.algorithms.sft.loop import train_sft
from specopd_trainer.loops import engine

TOL = 1e-5


def _losses(run: Path):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _rows(run: Path):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _single(run: Path, seed: int = 0) -> dict:
    d = tiny_drafter(seed=seed)
    train_sft(d, tiny_sequences(), tiny_sequences()[:2], run, cfg(parallel="ddp"), progress=False)
    return d.state_dict()


def _close(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Single-process runs (straight, and one crashed after step 12 for an FSDP2 resume) and the worker's FSDP2
    runs (one torchrun launch)."""
    out = tmp_path_factory.mktemp("fsdp")
    single = _single(out / "single")
    crashed = out / "from_single"
    engine_progress = engine.TrainProgress
    engine.TrainProgress = crash_at(12)
    try:
        with pytest.raises(Exception, match="12"):
            train_sft(tiny_drafter(), tiny_sequences(), [], crashed, cfg(parallel="ddp"), progress=False)
    finally:
        engine.TrainProgress = engine_progress
    assert (crashed / "checkpoints" / "latest").read_text() == "step-0000010.pt"
    worker = Path(__file__).with_name("_fsdp_sft_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, single


def _fsdp_weights(run: Path) -> dict:
    r0 = torch.load(run / "rank0.pt")
    r1 = torch.load(run / "rank1.pt")
    for k in r0:  # materialised at the end: every rank holds the same full tensors
        assert torch.equal(r0[k], r1[k]), k
    return r0


@pytest.mark.slow
def test_fsdp2_matches_single_process(runs):
    out, single = runs
    a, b = _rows(out / "single"), _rows(out / "fsdp")
    assert [r["step"] for r in b] == list(range(1, 21))
    for ra, rb in zip(a, b):
        assert abs(ra["loss"] - rb["loss"]) < TOL, (ra["step"], ra["loss"], rb["loss"])
        assert abs(ra["grad_norm"] - rb["grad_norm"]) < 1e-4 * max(1.0, ra["grad_norm"])
        assert ra["train_tokens"] == rb["train_tokens"]  # the same global batch
        assert str(ra["eval_walk_tau"]) == str(rb["eval_walk_tau"])  # the evaluation on gathered weights (nan: none)
    assert [r["eval_walk_tau"] >= 1.0 for r in b[10:]] == [True] * 10  # evaluated (not nan) after step 10
    assert _losses(out / "single")[-1] < 0.9 * _losses(out / "single")[0]  # it trained
    fsdp = _fsdp_weights(out / "fsdp")
    assert _close(fsdp, single) < TOL
    assert _close(tiny_drafter().state_dict(), single) > 1e-3  # the weights moved


@pytest.mark.slow
def test_fsdp2_crash_and_resume_ends_like_the_straight_run(runs):
    out, single = runs
    assert len(_rows(out / "crash")) == 20  # the resumed run logged steps 11.. again: one row per step
    assert _losses(out / "crash") == pytest.approx(_losses(out / "fsdp"), abs=TOL)
    assert _close(_fsdp_weights(out / "crash"), _fsdp_weights(out / "fsdp")) < TOL


@pytest.mark.slow
def test_checkpoints_move_between_fsdp2_and_one_process(runs, tmp_path):
    out, single = runs
    # a single-process checkpoint (step 10) resumed under FSDP2
    assert _close(_fsdp_weights(out / "from_single"), single) < TOL
    # an FSDP2 checkpoint (step 10: full tensors, optimizer keyed by index) resumed in one process
    state = torch.load(out / "crash_copy" / "checkpoints" / "step-0000010.pt", weights_only=False)
    ref = torch.load(out / "from_single" / "checkpoints" / "step-0000020.pt", weights_only=False)
    assert state["drafter"].keys() == tiny_drafter().state_dict().keys()
    assert sorted(state["optimizer"]["state"]) == list(range(len(state["optimizer"]["state"])))
    run = tmp_path / "resume"
    shutil.copytree(out / "crash_copy", run)
    d = tiny_drafter(seed=99)
    train_sft(d, tiny_sequences(), [], run, cfg(parallel="ddp"), progress=False)
    assert _close(d.state_dict(), single) < TOL
    assert _losses(run)[10:] == pytest.approx(_losses(out / "single")[10:], abs=TOL)
    assert ref["step"] == 20


@pytest.fixture(scope="module")
def specopd_runs(tmp_path_factory):
    """The SpecOPD FSDP2 worker's runs (one torchrun launch)."""
    out = tmp_path_factory.mktemp("fsdp_specopd")
    worker = Path(__file__).with_name("_fsdp_specopd_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.mark.slow
def test_specopd_fsdp2_pushes_full_weights_and_resumes_exactly(specopd_runs):
    """SpecOPD under FSDP2: the ranks end with the same full weights, a mid-run push carries the full drafter of that
    step (the step-4 checkpoint's), and a crash after step 5 + resume ends where the straight run does."""
    out = specopd_runs
    straight = _fsdp_weights(out / "straight")
    assert _close(straight, tiny_drafter().state_dict()) > 1e-3  # it trained
    ckpt = torch.load(out / "straight" / "checkpoints" / "step-0000004.pt", weights_only=False)
    pushed = torch.load(out / "straight" / "push4.pt")
    assert _close(pushed, ckpt["drafter"]) == 0.0
    assert _close(torch.load(out / "straight" / "push6.pt"), straight) == 0.0
    assert _close(pushed, straight) > 1e-4  # a push is the weights of its step, not the final ones
    assert _close(_fsdp_weights(out / "crash"), straight) < 1e-6
    assert _losses(out / "crash") == pytest.approx(_losses(out / "straight"), abs=1e-6)


@pytest.fixture(scope="module")
def draft_opd_runs(tmp_path_factory):
    """A single-process Draft-OPD run on the fake server and the worker's DDP / FSDP2 runs (one torchrun launch)."""
    from fakes.draft_opd import PROMPTS, FakeServer, draft_opd_config as _cfg, pusher as _pusher

    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    out = tmp_path_factory.mktemp("dist_draft_opd")
    server = FakeServer()
    summary = train_draft_opd(tiny_drafter(), server, PROMPTS, out / "single", _cfg(), push=_pusher(server, []),
                              progress=False)
    worker = Path(__file__).with_name("_dist_draft_opd_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, summary, server.generated


COUNTS = ("records", "error_records", "accepted_per_slot", "rejected_per_slot", "blocks", "accepted_tokens",
          "rejected_tokens", "step_supervised_tokens", "supervised_tokens")


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_draft_opd_under_torchrun_splits_the_single_process_rollouts(draft_opd_runs, parallel):
    """Draft-OPD on 2 ranks: each rank rolls out half the step's prompts (the single-process draw), so the summed
    counts of every step equal the single-process run's; rank 0's pushes reach every rank's ledger; the ranks end
    with the same trained weights."""
    out, single, generated = draft_opd_runs
    run = out / parallel
    for rank in (0, 1):
        info = json.loads((run / f"rank{rank}.json").read_text())
        assert info["pushed"] == [0, 2, 4] and info["versions"] == single["versions"]
        assert info["generated"] == generated // 2  # its share of the prompts
    for a, b in zip(_rows(out / "single"), _rows(run), strict=True):
        assert {k: a[k] for k in COUNTS} == {k: b[k] for k in COUNTS}, a["step"]
        assert b["stale_records"] == 0 and b["unknown_version_records"] == 0
    weights = _fsdp_weights(run)
    assert _close(weights, tiny_drafter().state_dict()) > 1e-3


@pytest.mark.slow
def test_draft_opd_fsdp2_crash_and_resume_is_exact(draft_opd_runs):
    out, _, _ = draft_opd_runs
    assert _close(_fsdp_weights(out / "fsdp2_crash"), _fsdp_weights(out / "fsdp2")) < 1e-6
    assert _losses(out / "fsdp2_crash") == pytest.approx(_losses(out / "fsdp2"), abs=1e-6)
    info = json.loads((out / "fsdp2_crash" / "rank1.json").read_text())
    assert info["versions"] == json.loads((out / "fsdp2" / "rank1.json").read_text())["versions"]


def test_what_cannot_run_sharded_is_refused_in_one_line(monkeypatch, tmp_path):
    """Sequential OPD refuses fsdp2 (config and CLI: one ``error:`` line, exit 2) and torchrun (typed error);
    SpecOPD refuses FSDP2 with fewer sequences per step than ranks; Draft-OPD refuses --from-traffic under torchrun.
    All before any collective or server call (a world of 2 is faked)."""
    from pydantic import ValidationError
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app
    from specopd_trainer.algorithms.draft_opd import loop as draft_loop
    from specopd_trainer.algorithms.draft_opd.config import DraftOPDConfig
    from specopd_trainer.algorithms.registry import AlgorithmError, ShardingRefusedError
    from specopd_trainer.algorithms.sequential_opd import loop as seq_loop
    from specopd_trainer.algorithms.sequential_opd.config import SequentialOPDConfig
    from specopd_trainer.algorithms.specopd import loop as specopd_loop
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig

    with pytest.raises(ValidationError, match="sequential OPD cannot run sharded"):
        SequentialOPDConfig(parallel="fsdp2")
    _register_subcommands()
    res = CliRunner().invoke(app, ["train", "sequential-opd", "--server", "http://127.0.0.1:9", "--parallel", "fsdp2"],
                             env={"SPECOPD_ADMIN_KEY": None, "SPECOPD_API_KEY": None})
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.strip().splitlines() == [
        "error: sequential OPD cannot run sharded (fsdp2): it pushes the drafter and rolls out through the server "
        "before every step, in a single process"]
    assert issubclass(ShardingRefusedError, AlgorithmError)  # the CLI prints it as one error: line (exit 1)

    for module in (seq_loop, specopd_loop, draft_loop):
        monkeypatch.setattr(module, "dist_info", lambda: (0, 2))
    with pytest.raises(ShardingRefusedError, match="not under torchrun"):
        seq_loop.train_sequential_opd(tiny_drafter(), None, [[1, 2]], tmp_path / "s", SequentialOPDConfig(),
                                      push=lambda *a: None)
    with pytest.raises(ShardingRefusedError, match=r"seqs_per_step \(1\) must be at least the 2 ranks"):
        specopd_loop.train_specopd(tiny_drafter(), None, tiny_sequences(), tmp_path / "o",
                                   SpecOPDConfig(seqs_per_step=1, parallel="fsdp2"))
    with pytest.raises(ShardingRefusedError, match="from-traffic .* single process"):
        draft_loop.train_draft_opd(tiny_drafter(), None, [], tmp_path / "d", DraftOPDConfig(from_traffic=True),
                                   push=lambda *a: None)
    with pytest.raises(ShardingRefusedError, match=r"rollout_prompts \(1\) must be at least the 2 ranks"):
        draft_loop.train_draft_opd(tiny_drafter(), None, [[1, 2]], tmp_path / "d", DraftOPDConfig(rollout_prompts=1),
                                   push=lambda *a: None)
    assert not any((tmp_path / d).exists() for d in ("s", "o", "d"))  # refused before touching the run dir
