"""``specopd train draft-opd`` against a real tiny SPECOPD server with an admin key (conftest's shared
``tiny_admin_server``): two steps of live rollouts (metrics rows, hot pushes before each step and at the end, the
saved drafter), a resume to a third step, and the admin-key refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from _servers import drafter_info as info
from conftest import TINY_ADMIN_KEY, TINY_BLOCK_SIZE
from fakes.cli import metric_rows as rows
from fakes.cli import train_cli as cli

ADMIN_KEY = TINY_ADMIN_KEY


@pytest.fixture(scope="module")
def server(tiny_admin_server):
    """conftest's shared tiny SPECOPD server with an admin key (tests/_servers.py)."""
    return tiny_admin_server


def _args(url: str, run: Path, steps: int, *extra: str) -> list:
    return ["draft-opd", "--server", url, "--admin-key", ADMIN_KEY, "--data", "dialogue,math", "--per-domain", "2",
            "--run-dir", str(run), "--steps", str(steps), "--rollout-prompts", "3", "--rollout-tokens", "16",
            "--temperature", "0", "--no-progress", *extra]


@pytest.mark.server
def test_draft_opd_trains_pushes_and_resumes(server, tmp_path: Path) -> None:
    run = tmp_path / "run"
    swaps0 = info(server.url)["swaps"]
    res = cli(*_args(server.url, run, 2))
    assert res.exit_code == 0, res.output
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2]
    g = TINY_BLOCK_SIZE - 1
    for r in got:
        assert r["blocks"] > 0 and r["rejected_tokens"] > 0 and len(r["accepted_per_slot"]) == g
        assert r["step_supervised_tokens"] == r["accepted_tokens"] + r["rejected_tokens"]
        assert r["stale_records"] == 0 and r["unknown_version_records"] == 0  # every record from the push
        assert 1.0 <= r["rollout_tau"] <= TINY_BLOCK_SIZE
    # pushed before each step (push-every 1) and at the end
    now = info(server.url)
    assert now["swaps"] == swaps0 + 3 and now["version"] == "draftopd-run-step2"
    assert (run / "drafter" / "model.safetensors").is_file() and (run / "versions.json").is_file()
    res = cli(*_args(server.url, run, 3))
    assert res.exit_code == 0, res.output
    again = rows(run)
    assert again[:2] == got and again[2]["step"] == 3
    assert again[2]["supervised_tokens"] == got[1]["supervised_tokens"] + again[2]["step_supervised_tokens"]
    assert info(server.url)["version"] == "draftopd-run-step3"
    res = cli("draft-opd", "--server", server.url, "--data", "math", "--run-dir", str(tmp_path / "nokey"))
    assert res.exit_code == 2 and "--admin-key" in res.stderr
