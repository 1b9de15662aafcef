"""``specopd train {specopd,sequential-opd}`` against a real tiny SPECOPD server with an admin key.

One server (tiny fp32 target, random block-4 drafter, ``--admin-api-key``: conftest's shared
``tiny_admin_server``, serving its start-up drafter when this module starts). Checked: metrics rows and keys,
cumulative supervised tokens, hot pushes every N steps and at the end (the server's version), resume from the run
directory (one new row, cumulative counters continue, same losses as a straight run), the SGLang-loadable final
drafter, refusals (wrong admin key -> the old drafter keeps serving; unknown loss / domain, missing data,
unreachable server) without a traceback, and two steps of sequential-rollout OPD.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from _servers import drafter_info as info
from conftest import TINY_ADMIN_KEY, TINY_BLOCK_SIZE
from fakes.cli import metric_rows as rows
from fakes.cli import train_cli as cli

ADMIN_KEY = TINY_ADMIN_KEY
METRIC_KEYS = {"step", "loss", "lr", "grad_norm", "wall_s", "est_tau", "alpha", "step_supervised_tokens",
               "supervised_tokens", "supervised_wall_s", "supervised_tokens_per_s"}
SEQS, ANCHORS, BRANCHES = 2, 2, 2


@pytest.fixture(scope="module")
def server(tiny_admin_server):
    """conftest's shared tiny SPECOPD server with an admin key, serving its start-up drafter (tests/_servers.py)."""
    return tiny_admin_server


def specopd_args(url: str, run: Path, steps: int, data: str = "dialogue,math", *extra: str) -> list:
    return ["specopd", "--server", url, "--admin-key", ADMIN_KEY, "--data", data, "--per-domain", "2",
            "--max-new-tokens", "24", "--run-dir", str(run), "--steps", str(steps), "--push-every", "2",
            "--anchors", str(ANCHORS), "--branches", str(BRANCHES), "--seqs-per-step", str(SEQS), "--lr", "1e-3",
            "--warmup", "1", "--ckpt-every", "2", "--no-progress",
            # the paper's loss without root anchors (the command's defaults are the validated recipe: e2e_fkl_is
            # with 64 root anchors), so that the supervised-token bounds below hold
            "--loss", "e2e_tv", "--root-anchors", "0", *extra]

def torchrun_train(args: list) -> "subprocess.CompletedProcess[str]":
    """``specopd train ARGS`` under ``torchrun --standalone --nproc_per_node 2`` (one OpenMP thread per rank, no
    key from the environment); asserts it exited 0 on 2 ranks without a traceback."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("SPECOPD_ADMIN_KEY", "SPECOPD_API_KEY")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "sglang_specopd.app.cli.entry", "train", *args], env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 rank(s)" in proc.stderr and "Traceback" not in proc.stderr
    return proc


@pytest.mark.server
def test_specopd_pushes_resumes_and_saves(server, tmp_path: Path) -> None:
    from specopd_trainer.drafters.dflash import DFlashDrafter

    run = tmp_path / "run"
    swaps0 = info(server.url)["swaps"]
    res = cli(*specopd_args(server.url, run, 3))
    assert res.exit_code == 0, res.output
    first = rows(run)
    assert [r["step"] for r in first] == [1, 2, 3]
    g = TINY_BLOCK_SIZE - 1
    cumulative = 0
    for r in first:
        assert METRIC_KEYS <= set(r), r.keys()
        assert len(r["alpha"]) == g and all(0.0 <= a <= 1.0 for a in r["alpha"])
        assert 1.0 <= r["est_tau"] <= TINY_BLOCK_SIZE
        assert 0 < r["step_supervised_tokens"] <= SEQS * ANCHORS * BRANCHES * g
        cumulative += r["step_supervised_tokens"]
        assert r["supervised_tokens"] == cumulative
        assert r["supervised_tokens_per_s"] == pytest.approx(cumulative / r["supervised_wall_s"], rel=1e-9)
    walls = [r["supervised_wall_s"] for r in first]
    assert 0 < walls[0] < walls[1] < walls[2]
    # pushed at step 2 (--push-every 2) and at the end (step 3): the server serves the last push
    now = info(server.url)
    assert now["version"] == "specopd-run-step3" and now["swaps"] == swaps0 + 2
    assert "now serves drafter version 'specopd-run-step3'" in res.stdout
    assert f"drafter saved to {run / 'drafter'}" in res.stdout
    assert (run / "data" / "responses.jsonl").is_file() and (run / "data" / "features" / "index.json").is_file()
    saved = DFlashDrafter.from_pretrained(run / "drafter")
    ckpt = torch.load(run / "checkpoints" / "step-0000003.pt", weights_only=False)
    for name, t in saved.state_dict().items():
        assert torch.equal(t, ckpt["drafter"][name]), name

    # resume: one more step continues from step 3 (the cumulative counter too)
    res = cli(*specopd_args(server.url, run, 4))
    assert res.exit_code == 0, res.output
    second = rows(run)
    assert second[:3] == first and [r["step"] for r in second] == [1, 2, 3, 4]
    assert second[3]["supervised_tokens"] == cumulative + second[3]["step_supervised_tokens"]
    assert second[3]["supervised_wall_s"] > walls[2]  # the wall counter continues across the resume too
    assert info(server.url)["version"] == "specopd-run-step4"

    # exact resume: a crash after step 2 of a 4-step run (checkpoint of step 2, metrics rows past it), resumed,
    # gives the straight run's rows (the directory form of --data: the responses + features cached above)
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    res = cli(*specopd_args(server.url, straight, 4, str(run / "data")))
    assert res.exit_code == 0, res.output
    crashed.mkdir()
    for name in ("run_config.json", "counters.json", "metrics.jsonl"):
        shutil.copy(straight / name, crashed / name)
    (crashed / "checkpoints").mkdir()
    shutil.copy(straight / "checkpoints" / "step-0000002.pt", crashed / "checkpoints")
    (crashed / "checkpoints" / "latest").write_text("step-0000002.pt")
    res = cli(*specopd_args(server.url, crashed, 4, str(run / "data")))
    assert res.exit_code == 0, res.output
    a, b = rows(straight), rows(crashed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    same = ("step", "loss", "lr", "grad_norm", "est_tau", "alpha", "step_supervised_tokens", "supervised_tokens")
    assert [{k: r[k] for k in same} for r in b] == [{k: r[k] for k in same} for r in a]  # bit-identical

    # resuming with other method options is refused
    res = cli(*specopd_args(server.url, run, 5, "dialogue,math", "--loss", "tv"))
    assert res.exit_code == 2 and "other options" in res.stderr and "loss" in res.stderr


@pytest.mark.server
def test_wrong_admin_key_is_refused_and_old_drafter_keeps_serving(server, tmp_path: Path) -> None:
    before = info(server.url)
    args = specopd_args(server.url, tmp_path / "run", 2)
    args[args.index("--admin-key") + 1] = "wrong-key"
    res = cli(*args)
    assert res.exit_code == 1
    assert "push refused" in res.stderr and "admin key" in res.stderr and "HTTP 401" in res.stderr
    assert info(server.url) == before


@pytest.mark.server
def test_sequential_opd_two_steps(server, tmp_path: Path) -> None:
    run = tmp_path / "seq"
    swaps0 = info(server.url)["swaps"]
    res = cli("sequential-opd", "--server", server.url, "--admin-key", ADMIN_KEY, "--data", "dialogue,math",
              "--per-domain", "2", "--run-dir", str(run), "--steps", "2", "--rollout-prompts", "2",
              "--rollout-tokens", "12", "--temperature", "1.0", "--no-progress")
    assert res.exit_code == 0, res.output
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert {"loss", "est_tau", "records", "step_supervised_tokens", "supervised_tokens"} <= set(r)
        assert r["records"] > 0 and r["step_supervised_tokens"] == r["records"] * (TINY_BLOCK_SIZE - 1)
    assert got[1]["supervised_tokens"] == got[0]["step_supervised_tokens"] + got[1]["step_supervised_tokens"]
    # pushed before each step (on-policy rollouts) and at the end
    now = info(server.url)
    assert now["swaps"] == swaps0 + 3 and now["version"] == "seqopd-seq-step2"
    assert (run / "drafter" / "model.safetensors").is_file()


@pytest.mark.server
def test_bad_input_fails_cleanly(server, tmp_path: Path) -> None:
    base = specopd_args(server.url, tmp_path / "run", 2)

    res = cli(*base, "--loss", "nope")
    assert res.exit_code == 2 and "unknown SpecOPD loss 'nope'" in res.stderr and "e2e_tv" in res.stderr

    bad = list(base)
    bad[bad.index("--data") + 1] = "dialogue,poetry"
    res = cli(*bad)
    assert res.exit_code == 2 and "unknown domain 'poetry'" in res.stderr

    bad[bad.index("--data") + 1] = str(tmp_path / "no-such-dir")
    res = cli(*bad)
    assert res.exit_code == 2 and "not a directory" in res.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    bad[bad.index("--data") + 1] = str(empty)
    res = cli(*bad)
    assert res.exit_code == 2 and "responses.jsonl is missing" in res.stderr

    from sglang_specopd.app.launch.process import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    res = cli(*specopd_args(dead, tmp_path / "run", 2))
    assert res.exit_code == 1 and f"cannot reach the server at {dead}" in res.stderr

    res = cli("sequential-opd", "--server", server.url, "--data", "math", "--run-dir", str(tmp_path / "s"))
    assert res.exit_code == 2 and "--admin-key" in res.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.server
def test_specopd_ddp_two_gloo_ranks(server, tmp_path: Path) -> None:
    """``torchrun --nproc_per_node 2``: rank 0 prepares the data first, both ranks train (their supervised tokens
    are summed in the log), only rank 0 logs, checkpoints and pushes."""
    run = tmp_path / "ddp"
    swaps0 = info(server.url)["swaps"]
    args = specopd_args(server.url, run, 2, "dialogue")
    proc = torchrun_train(args)
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2]
    # each rank supervises at most SEQS*ANCHORS*BRANCHES*G tokens: more than that means both ranks were summed
    assert all(r["step_supervised_tokens"] > SEQS * ANCHORS * BRANCHES * (TINY_BLOCK_SIZE - 1) for r in got)
    assert got[1]["supervised_tokens"] == sum(r["step_supervised_tokens"] for r in got)
    now = info(server.url)
    assert now["swaps"] == swaps0 + 1 and now["version"] == "specopd-ddp-step2"  # pushed once, by rank 0
    assert proc.stdout.count("drafter saved to") == 1


@pytest.mark.server
def test_specopd_fsdp2_two_gloo_ranks_then_one_process(server, tmp_path: Path) -> None:
    """``torchrun --nproc_per_node 2 ... --parallel fsdp2``: the step's SEQS sequences are split across the ranks (the
    single-process batch, so at most its supervised tokens), rank 0 pushes the gathered drafter once and saves it;
    the run then resumes in ONE process from the FSDP2 checkpoint (full tensors) for a third step."""
    from specopd_trainer.drafters.dflash import DFlashDrafter

    run = tmp_path / "fsdp2"
    swaps0 = info(server.url)["swaps"]
    args = specopd_args(server.url, run, 2, "dialogue", "--parallel", "fsdp2")
    proc = torchrun_train(args)
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2]
    assert all(0 < r["step_supervised_tokens"] <= SEQS * ANCHORS * BRANCHES * (TINY_BLOCK_SIZE - 1) for r in got)
    now = info(server.url)
    assert now["swaps"] == swaps0 + 1 and now["version"] == "specopd-fsdp2-step2"  # pushed once, by rank 0
    assert proc.stdout.count("drafter saved to") == 1
    ckpt = torch.load(run / "checkpoints" / "step-0000002.pt", weights_only=False)
    for name, t in DFlashDrafter.from_pretrained(run / "drafter").state_dict().items():
        assert torch.equal(t, ckpt["drafter"][name]), name  # full tensors, the saved drafter's
    res = cli(*specopd_args(server.url, run, 3, "dialogue"))  # one process, --parallel ddp (the default)
    assert res.exit_code == 0, res.output
    assert [r["step"] for r in rows(run)] == [1, 2, 3] and rows(run)[:2] == got
    assert info(server.url)["version"] == "specopd-fsdp2-step3"


@pytest.mark.server
def test_sft_pushes_at_the_end(server, tmp_path: Path) -> None:
    run = tmp_path / "sft"
    swaps0 = info(server.url)["swaps"]
    res = cli("sft", "--server", server.url, "--admin-key", ADMIN_KEY, "--data", "dialogue", "--per-domain", "3",
              "--max-new-tokens", "24", "--run-dir", str(run), "--steps", "2", "--anchors", "2", "--seqs-per-step",
              "2", "--log-every", "1", "--no-progress")
    assert res.exit_code == 0, res.output
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2] and all(r["loss"] > 0 for r in got)
    assert got[1]["train_tokens"] == 2 * 2 * 2 * (TINY_BLOCK_SIZE - 1)  # steps x seqs x anchors x (B-1)
    now = info(server.url)
    assert now["swaps"] == swaps0 + 1 and now["version"] == "sft-sft-step2"
    assert (run / "drafter" / "model.safetensors").is_file()
