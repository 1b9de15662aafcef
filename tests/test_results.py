"""Result files (sglang_specopd/app/results.py): the shared header, history instead of overwriting, provenance."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sglang_specopd.app import results as R


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch):
    """Each test starts as a process that has written nothing yet."""
    monkeypatch.setattr(R, "_WRITTEN", set())


def _as_other_run(path: Path) -> None:
    """Forget that this process wrote ``path``, as if a later run came along."""
    R._WRITTEN.discard(path.resolve())


def test_rewrite_by_another_run_moves_old_file_to_history(tmp_path: Path) -> None:
    out = tmp_path / "results" / "bench_cpu.json"
    R.write_result(out, {"value": 1}, command="first")
    first = json.loads(out.read_text())
    assert first["value"] == 1 and first["command"] == "first"
    assert {"git_commit", "created", "machine", "versions"} <= set(first)
    _as_other_run(out)
    R.write_result(out, {"value": 2}, command="second")
    assert json.loads(out.read_text())["value"] == 2  # the newest keeps the name the benchmarks use
    hist = sorted((tmp_path / "results" / "history").iterdir())
    assert [p.name for p in hist] == [f"bench_cpu.{R._stamp(first['created'])}.json"]
    assert json.loads(hist[0].read_text()) == first  # moved byte for byte, not rewritten
    assert sorted(p.name for p in out.parent.iterdir()) == ["bench_cpu.json", "history"]  # no temp file left


def test_same_process_rewrites_in_place(tmp_path: Path) -> None:
    """A sweep saving after every arm updates its own file; only another run's file goes to history."""
    out = tmp_path / "sweep.json"
    out.write_text(json.dumps({"created": "2026-01-02T03:04:05+00:00", "arms": ["old run"]}))
    for n in range(3):
        R.write_result(out, {"arms": list(range(n + 1))}, command="sweep")
    assert json.loads(out.read_text())["arms"] == [0, 1, 2]
    assert [p.name for p in (tmp_path / "history").iterdir()] == ["sweep.20260102T030405Z.json"]


def test_history_never_clobbers_and_tags_fall_back(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    same = {"created": "2026-11-29T18:30:20+00:00", "n": 0}
    for n in range(3):  # three old files with the same created time
        out.write_text(json.dumps({**same, "n": n}))
        R.archive_existing(out)
    hist = tmp_path / "history"
    names = sorted(p.name for p in hist.iterdir())
    assert names == ["r.20261129T183020Z.2.json", "r.20261129T183020Z.3.json", "r.20261129T183020Z.json"]
    assert [json.loads((hist / n).read_text())["n"] for n in names] == [1, 2, 0]
    out.write_text(json.dumps({"git_commit": "0123456789abcdef0123+dirty"}))  # no created: the commit
    assert R.history_tag(out) == "0123456789ab-dirty"
    out.write_text("{not json")  # unreadable JSON: the file's mtime (UTC)
    os.utime(out, (1_700_000_000, 1_700_000_000))
    assert R.history_tag(out) == "20231114T221320Z"
    assert R.archive_existing(tmp_path / "absent.json") is None


def test_failed_write_moves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"created": "2026-01-01T00:00:00+00:00", "keep": True}))
    with pytest.raises(TypeError):
        R.write_result(out, {"bad": object()})
    assert json.loads(out.read_text())["keep"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_save_figure_moves_earlier_plot(tmp_path: Path) -> None:
    class Fig:
        def __init__(self, body: bytes) -> None:
            self.body = body

        def savefig(self, path, dpi):
            Path(path).write_bytes(self.body + str(dpi).encode())

    png = tmp_path / "plot.png"
    png.write_bytes(b"old")
    os.utime(png, (1_700_000_000, 1_700_000_000))
    assert R.save_figure(Fig(b"new"), png, dpi=90) == png and png.read_bytes() == b"new90"
    R.save_figure(Fig(b"newer"), png)  # same process: replaced in place
    assert png.read_bytes() == b"newer120"
    assert [(p.name, p.read_bytes()) for p in (tmp_path / "history").iterdir()] == [
        ("plot.20231114T221320Z.png", b"old")]


def test_git_commit_dirty_counts_untracked_but_not_ignored(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "init")
    (tmp_path / ".gitignore").write_text("runs/\n")
    git("add", ".gitignore")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "ignore")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert R.git_commit(tmp_path) == head
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "log.txt").write_text("ignored")
    assert R.git_commit(tmp_path) == head  # ignored files do not count
    (tmp_path / "new_module.py").write_text("x = 1\n")
    assert R.git_commit(tmp_path) == head + "+dirty"  # an untracked, non-ignored file does
    assert R.git_commit(tmp_path / "runs").endswith("+dirty")
    assert R.git_commit(tmp_path.parent / "definitely-not-a-repo-xyz") is None


def test_result_files_record_portable_paths(tmp_path: Path, monkeypatch) -> None:
    """Paths of this machine never reach a result file: under the repository -> relative, under $SPECOPD_HOME ->
    ``$SPECOPD_HOME/...``, in the command line too; other strings and numbers untouched."""
    monkeypatch.setenv("SPECOPD_HOME", str(tmp_path / "home"))
    repo = Path(R.__file__).resolve().parents[2]
    out = R.write_result(tmp_path / "r.json", {
        "drafter": str(repo / "runs" / "x" / "drafter"), "target": str(tmp_path / "home" / "models" / "S"),
        "nested": [{"log": f"see {repo}/benchmarks/a.log"}], "value": 1.5, "other": "/opt/elsewhere"},
        command=f"python {repo}/benchmarks/x.py --out {repo}/benchmarks/results/x.json")
    data = json.loads(out.read_text())
    assert data["drafter"] == "runs/x/drafter" and data["target"] == "$SPECOPD_HOME/models/S"
    assert data["nested"] == [{"log": "see benchmarks/a.log"}] and data["value"] == 1.5
    assert data["other"] == "<abs>/elsewhere"  # another disk's path: only its last component (issue 50)
    assert data["command"] == "python benchmarks/x.py --out benchmarks/results/x.json"
    # whole path components only (the repository's own prefixes: a clone under the temp directory would turn the
    # sibling into $TMPDIR/...)
    only_repo = [(str(repo) + "/", ""), (str(repo), ".")]
    assert R.portable([f"{repo}2/x", str(repo)], only_repo) == ["<abs>/x", "."]  # not "2/x"
