"""The shared shape of result files under ``benchmarks/results/`` (see shared notes ``results.md``).

Every result JSON carries ``command``, ``git_commit``, ``created``, ``machine`` and ``versions`` so that it can be
traced back to the code and machine that produced it; :func:`write_result` adds them and writes atomically.

Results are never overwritten: before a file is replaced by another run, the old one moves to ``history/`` beside
it (``benchmarks/results/history/<stem>.<created or commit>.json``), so the newest keeps the name the benchmarks
and the report use and every earlier measurement stays on disk. A process that rewrites a file it wrote itself
(a sweep saving after every arm) replaces it in place. :func:`save_figure` does the same for plots.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Optional, Set

HISTORY_DIR = "history"
_WRITTEN: Set[Path] = set()  # files this process wrote: rewriting them replaces in place (no history entry)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> Dict[str, Any]:
    """CPU model, its widest SIMD level (torch's ``get_cpu_capability``, e.g. ``AVX2``, ``AVX512``), whether it has
    native bf16 (the CPU serving dtype follows it, :mod:`sglang_specopd.app.cpu_dtype`), core count, GPU (name or
    None), memory in GiB, the dtype a CPU config's ``dtype: auto`` serves in here (``cpu_serving_dtype``) and the
    OpenMP threads a CPU server gets (``cpu_server_threads``: ``SPECOPD_CPU_SERVER_THREADS`` / ``OMP_NUM_THREADS``,
    else 1, as the plugin sets them)."""
    from sglang_specopd.app.cpu_dtype import cpu_has_native_bf16

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
    simd = None
    try:
        import torch

        simd = torch.backends.cpu.get_cpu_capability()
    except Exception:  # torch missing or too old
        simd = None
    from sglang_specopd.app.cpu_dtype import resolve_dtype

    return {"cpu": _cpu_model(), "cpu_simd": simd, "cpu_native_bf16": cpu_has_native_bf16(), "cores": os.cpu_count(),
            "gpu": gpu, "memory_gib": mem_gib, "cpu_serving_dtype": resolve_dtype("cpu", "auto"),
            "cpu_server_threads": int(os.environ.get("SPECOPD_CPU_SERVER_THREADS")
                                      or os.environ.get("OMP_NUM_THREADS") or 1)}


def machine_kind(machine: Optional[Dict[str, Any]] = None) -> str:
    """A short name of the machine kind for result file names: ``xeon-avx512-bf16``, ``epyc-avx2-fp32``, or the GPU
    (``nvidia-h100-80gb-hbm3``). ``machine``: a :func:`machine_info` dict (default: this machine's)."""
    m = machine or machine_info()
    if m.get("gpu"):
        return "-".join(str(m["gpu"]).lower().replace("nvidia ", "nvidia-").split())
    cpu = str(m.get("cpu") or "")
    vendor = "xeon" if "Xeon" in cpu else "epyc" if "EPYC" in cpu else "cpu"
    simd = str(m.get("cpu_simd") or "unknown-simd").lower()
    return f"{vendor}-{simd}-{'bf16' if m.get('cpu_native_bf16') else 'fp32'}"


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
    """HEAD commit of the repository holding this file (None outside git).

    '+dirty' is appended when the working tree differs from HEAD: modified or staged tracked files, or untracked
    files that are not git-ignored (a new module the run imported counts as much as an edited one).
    """
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal"], cwd=repo,
                               capture_output=True, text=True).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def _path_prefixes() -> list[tuple[str, str]]:
    """(absolute prefix, portable replacement), longest first: the repository root -> relative, ``$SPECOPD_HOME``,
    the temp directory -> ``$TMPDIR``, the user's home -> ``~``, a Python environment outside the repository ->
    ``$VENV``."""
    from sglang_specopd.wire.home import specopd_home

    repo = Path(__file__).resolve().parents[2]
    pairs = [(str(repo) + "/", ""), (str(repo), "."), (str(specopd_home().resolve()), "$SPECOPD_HOME"),
             (str(specopd_home()), "$SPECOPD_HOME"), (str(Path(tempfile.gettempdir()).resolve()), "$TMPDIR"),
             (str(Path.home()), "~")]
    pairs += [(env, "$VENV") for env in {sys.prefix, str(Path(sys.prefix).resolve())}
              if not (env + "/").startswith(str(repo) + "/")]
    return sorted({a: b for a, b in pairs if a not in ("", "/")}.items(), key=lambda p: -len(p[0]))


# An absolute filesystem path of two or more components left after the prefixes (not a URL's path: nothing
# glued before the slash; not a server route such as /v1/completions or /specopd/score_trees).
_ABS_PATH = re.compile(r"(?<![\w:/.~$<>-])/(?!(?:v1|specopd|generate|health|health_generate|get_model_info|"
                       r"get_server_info|flush_cache|metrics)\b)(?:[\w.@+$~-]+/)+[\w.@+$~-]*")


def portable(value: Any, _prefixes: Optional[list] = None) -> Any:
    """``value`` (any JSON-able structure) with this machine's absolute paths made portable in every string: under
    the repository -> relative to it, under ``$SPECOPD_HOME`` -> ``$SPECOPD_HOME/...``, under the temp directory ->
    ``$TMPDIR/...``, under the home directory -> ``~/...``, under a Python environment outside the repository ->
    ``$VENV/...``; any other absolute path of two or more components -> ``<abs>/`` and its last component (server
    routes such as ``/v1/completions`` and URLs stay); other values unchanged. Result files record these, never a
    machine's own paths."""
    prefixes = _path_prefixes() if _prefixes is None else _prefixes
    if isinstance(value, str):
        for prefix, repl in prefixes:
            end = "" if prefix.endswith("/") else r"(?![\w.-])"  # a whole path component, not /work/main2
            value = re.sub(re.escape(prefix) + end, lambda m, r=repl: r, value)
        # any other absolute path (another checkout, another machine's disk) keeps only its last component
        return _ABS_PATH.sub(lambda m: "<abs>/" + (m.group(0).rstrip("/").rsplit("/", 1)[-1]), value)
    if isinstance(value, dict):
        return {k: portable(v, prefixes) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, prefixes) for v in value]
    return value


def result_header(command: str | None = None) -> Dict[str, Any]:
    """The common keys: command (default: this process's argv), git_commit, created, machine, versions."""
    return {
        "command": command or " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "git_commit": git_commit(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
    }


def _stamp(text: str) -> Optional[str]:
    """ISO 8601 time -> ``20261129T183020Z`` (UTC); None if ``text`` is not a time."""
    try:
        t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    t = t.astimezone(timezone.utc) if t.tzinfo else t
    return t.strftime("%Y%m%dT%H%M%SZ")


def history_tag(path: str | Path) -> str:
    """The tag naming ``path``'s history entry: its ``created`` time, else its ``git_commit``, else its mtime.

    ``created`` and ``git_commit`` are read only from a JSON object file; the commit is shortened to 12 hex digits
    (``+dirty`` kept as ``-dirty``). Raises OSError if ``path`` cannot be read.
    """
    path = Path(path)
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except ValueError:
            data = None
        if isinstance(data, dict):
            tag = _stamp(data["created"]) if data.get("created") else None
            if tag is None and data.get("git_commit"):
                commit = str(data["git_commit"])
                tag = commit.split("+")[0][:12] + ("-dirty" if commit.endswith("+dirty") else "")
            if tag and re.fullmatch(r"[0-9A-Za-z._-]+", tag):
                return tag
    mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    return mtime.strftime("%Y%m%dT%H%M%SZ")


def archive_existing(path: str | Path) -> Optional[Path]:
    """Move ``path`` (if it exists) to ``<its dir>/history/<stem>.<tag><suffix>``; return the new path or None.

    ``tag`` is :func:`history_tag`. An existing history file is never replaced: a second entry with the same tag
    gets ``.2``, ``.3``, ... before the suffix. Raises OSError if the move fails.
    """
    path = Path(path)
    if not path.is_file():
        return None
    hist = path.parent / HISTORY_DIR
    hist.mkdir(parents=True, exist_ok=True)
    base = f"{path.stem}.{history_tag(path)}"
    dest, n = hist / f"{base}{path.suffix}", 1
    while True:
        try:  # O_EXCL claim: two writers never pick the same name
            os.close(os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            break
        except FileExistsError:
            n += 1
            dest = hist / f"{base}.{n}{path.suffix}"
    os.replace(path, dest)
    return dest


def _claim(path: Path) -> None:
    """Archive ``path``'s previous version unless this process wrote it; remember that it now did."""
    key = path.resolve()
    if key not in _WRITTEN:
        archive_existing(path)
    _WRITTEN.add(key)


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """``fig.savefig(path, dpi=dpi)`` after moving an earlier run's file at ``path`` to ``history/``; the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _claim(path)
    fig.savefig(path, dpi=dpi)
    return path


def write_result(path: str | Path, payload: Dict[str, Any], command: str | None = None) -> Path:
    """Write ``result_header(command) | payload`` as indented JSON, atomically; return the path. Every string has
    this machine's absolute paths made portable (:func:`portable`).

    A file already at ``path`` from another run first moves to ``history/`` beside it (:func:`archive_existing`);
    one this process wrote is replaced in place. Raises OSError if the directory cannot be written and TypeError
    if ``payload`` is not JSON-serialisable (then nothing is moved or written).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = portable({**result_header(command), **payload})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        _claim(path)  # only once the new result is complete on disk
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
