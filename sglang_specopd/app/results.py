"""The shared shape of result files under ``benchmarks/results/`` (see shared notes ``results.md``).

Every result JSON carries ``command``, ``git_commit``, ``created``, ``machine`` and ``versions`` so that it can be
traced back to the code and machine that produced it; :func:`write_result` adds them and writes atomically.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Dict


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> Dict[str, Any]:
    """CPU model, core count, GPU (name or None) and memory in GiB."""
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # torch missing or no driver: report no GPU
        gpu = None
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "gpu": gpu, "memory_gib": mem_gib}


def versions() -> Dict[str, Any]:
    """python, torch, sglang, transformers and this project's version."""
    out: Dict[str, Any] = {"python": platform.python_version()}
    for key, dist in (("torch", "torch"), ("sglang", "sglang"), ("transformers", "transformers"),
                      ("sglang_specopd", "sglang-specopd")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out


def git_commit(repo: Path | None = None) -> str | None:
    """HEAD commit of the repository holding this file (None outside git); '+dirty' if uncommitted changes."""
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def result_header(command: str | None = None) -> Dict[str, Any]:
    """The common keys: command (default: this process's argv), git_commit, created, machine, versions."""
    return {
        "command": command or " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "git_commit": git_commit(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
    }


def write_result(path: str | Path, payload: Dict[str, Any], command: str | None = None) -> Path:
    """Write ``result_header(command) | payload`` as indented JSON, atomically; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**result_header(command), **payload}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path
