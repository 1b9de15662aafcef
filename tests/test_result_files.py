"""Committed result files hold no machine's own paths or user names (issue 50 part 3).

Every JSON under ``benchmarks/results/`` (``history/`` included) and ``kernels/specopd_kernels/verified_kernels.json``
is read, and every string in it (keys too) is checked: no absolute filesystem path of two or more components
(``/home/...``, ``/root/...``, ``/work/...``, ``/tmp/...``, ``/Users/...``; server routes such as ``/v1/completions``,
``/generate`` and ``/specopd/...`` and the paths inside URLs are not filesystem paths), no Windows drive path
(``C:\\...``), no ``~user/`` home and no key naming a user or host. Paths are recorded repository-relative or as
``$SPECOPD_HOME/...``, ``$TMPDIR/...``, ``~/...``, ``$VENV/...`` (:func:`sglang_specopd.app.results.portable`, which
:func:`~sglang_specopd.app.results.write_result` applies; checked here too).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[1]
ROUTES = ("v1", "specopd", "generate", "health", "health_generate", "get_model_info", "get_server_info",
          "flush_cache", "metrics")
ABS_PATH = re.compile(r"(?<![\w:/.~$<>-])/(?:[\w.@+$~-]+/)+[\w.@+$~-]*")
WINDOWS = re.compile(r"\b[A-Za-z]:\\")
TILDE_USER = re.compile(r"(?<![\w$])~[A-Za-z_][\w.-]*/")
USER_KEYS = {"user", "username", "user_name", "login", "hostname", "host_name", "uid", "home"}


def result_files() -> List[Path]:
    files = sorted((REPO / "benchmarks" / "results").rglob("*.json"))
    return files + [REPO / "kernels" / "specopd_kernels" / "verified_kernels.json"]


def _strings(value: Any, keys: List[str]) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            keys.append(str(k))
            yield str(k)
            yield from _strings(v, keys)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, keys)
    elif isinstance(value, str):
        yield value


def machine_paths(text: str) -> List[str]:
    """The absolute filesystem paths, Windows paths and ``~user/`` homes in ``text``."""
    found = [m for m in ABS_PATH.findall(text) if m.split("/")[1] not in ROUTES]
    return found + WINDOWS.findall(text) + TILDE_USER.findall(text)


def test_detector() -> None:
    assert machine_paths("python /work/main/benchmarks/x.py --out=/tmp/a/b.json") == [
        "/work/main/benchmarks/x.py", "/tmp/a/b.json"]
    assert machine_paths('File "/root/.venv/lib/x.py"; /home/alice/x; /Users/bob/y; C:\\Users\\z; ~carol/x') == [
        "/root/.venv/lib/x.py", "/home/alice/x", "/Users/bob/y", "C:\\", "~carol/"]
    assert machine_paths("POST /v1/completions, /generate, /specopd/score_trees, http://127.0.0.1:3000/v1/models, "
                         "runs/x/drafter, $SPECOPD_HOME/models/S, ~/out/k.json, $TMPDIR/a/b, tokens/s, T0/T1, "
                         "<abs>/drafter, 1 / 2") == []


@pytest.mark.parametrize("path", result_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_machine_path_or_user_name_in_committed_result_files(path: Path) -> None:
    keys: List[str] = []
    bad = [hit for s in _strings(json.loads(path.read_text()), keys) for hit in machine_paths(s)]
    assert bad == [], f"{path.relative_to(REPO)}: machine paths {sorted(set(bad))[:5]}"
    assert not USER_KEYS & {k.lower() for k in keys}, f"{path.relative_to(REPO)}: a key naming a user or host"


def test_the_results_writer_never_writes_a_machine_path(tmp_path: Path, monkeypatch) -> None:
    import sys

    from sglang_specopd.app import results as R

    monkeypatch.setenv("SPECOPD_HOME", str(tmp_path / "home"))
    repo = Path(R.__file__).resolve().parents[2]
    out = R.write_result(tmp_path / "r.json", {
        "other_checkout": "/work/elsewhere/runs/sft/drafter", "user_home": "/home/alice/models/x",
        "mac": "/Users/bob/x.json", "venv": f"{sys.prefix}/bin/python -m x", "tmp": str(tmp_path / "a.log"),
        "repo": str(repo / "runs" / "x"), "routes": "POST /v1/completions and /specopd/score_trees",
        "url": "http://127.0.0.1:30000/generate", "n": 3}, command=f"{sys.executable} /opt/x/bench.py --out=/srv/r.json")
    text = out.read_text()
    data = json.loads(text)
    keys: List[str] = []
    assert [hit for s in _strings(data, keys) for hit in machine_paths(s)] == []
    assert data["other_checkout"] == "<abs>/drafter" and data["repo"] == "runs/x" and data["n"] == 3
    assert data["routes"] == "POST /v1/completions and /specopd/score_trees"
    assert data["url"] == "http://127.0.0.1:30000/generate"
    assert data["tmp"].endswith("/a.log") and not data["tmp"].startswith("/")
