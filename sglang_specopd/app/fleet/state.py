"""The state file of a fleet (``RUN_DIR/fleet.json``) and what ``specopd fleet stop`` does with it.

``specopd fleet start`` (the *supervisor*) writes the file atomically (a temporary file in the same directory,
``fsync``, ``os.replace``) whenever something changes: every process it started, with its pid, the start time the
kernel gives that pid (so a pid reused by an unrelated process is never taken for ours), URL, log, private TMPDIR,
CPU cores and the ``/dev/shm`` files its processes were seen to hold. Each worker and the router run in their own
session (process group = session = the leader's pid), so a group is stopped as a whole: no orphan schedulers.

:func:`stop_recorded` stops what a record names even when the supervisor is gone (``kill -9``): SIGTERM to the
group, SIGKILL after a timeout, then the ``/dev/shm`` files and the TMPDIR it left
(:mod:`sglang_specopd.app.launch.cleanup`). Keys (``--api-key``, ``--admin-api-key``) are never written here.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import List, Literal, Optional, Set, Tuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sglang_specopd.app.fleet.plan import FleetError
from sglang_specopd.app.launch.cleanup import remove_shm_files, remove_tree, session_pids, shm_refs_of_session

STATE_NAME = "fleet.json"
Status = Literal["starting", "ready", "stopping", "stopped", "failed"]
_FROZEN = ConfigDict(extra="forbid", frozen=True)


class ProcessRecord(BaseModel):
    """One process the fleet started: the supervisor, the router or a worker (``index``: the worker's number)."""

    model_config = _FROZEN

    role: Literal["supervisor", "router", "worker"]
    index: int = Field(default=0, ge=0)
    pid: int = Field(ge=1)
    start_ticks: Optional[int] = None  # /proc/PID/stat field 22: when the pid started (clock ticks since boot)
    url: Optional[str] = None
    log: Optional[str] = None
    tmpdir: Optional[str] = None
    cores: Optional[Tuple[int, ...]] = None
    shm: Tuple[Tuple[int, int], ...] = ()  # (st_dev, st_ino) of the /dev/shm files its processes held


class FleetState(BaseModel):
    """``RUN_DIR/fleet.json``."""

    model_config = _FROZEN

    format: Literal[1] = 1
    status: Status
    config: str
    host: str
    router_url: str
    supervisor: ProcessRecord
    router: Optional[ProcessRecord] = None
    workers: Tuple[ProcessRecord, ...] = ()
    api_key_set: bool = False
    admin_key_set: bool = False
    started_at: float
    updated_at: float
    message: str = ""

    @property
    def worker_urls(self) -> List[str]:
        return [w.url for w in self.workers if w.url]


def state_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / STATE_NAME


def write_state(run_dir: str | os.PathLike[str], state: FleetState) -> Path:
    """Write ``state`` to ``RUN_DIR/fleet.json`` atomically (readers see the old or the new file, never a part)."""
    path = state_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fleet-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(state.model_dump(mode="json"), indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read_state(run_dir: str | os.PathLike[str]) -> Optional[FleetState]:
    """The fleet state in ``run_dir``; None when there is none. Raises :class:`FleetError` for a corrupt file."""
    path = state_path(run_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FleetError(f"cannot read {path}: {exc}") from None
    try:
        return FleetState.model_validate_json(text)
    except ValidationError as exc:
        raise FleetError(f"{path} is not a fleet state file: {exc.errors()[0]['msg']}") from None


def start_ticks(pid: int, proc_root: str = "/proc") -> Optional[int]:
    """When process ``pid`` started (``/proc/PID/stat`` field 22); None when there is no such live process (a
    zombie counts as gone)."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def is_alive(rec: ProcessRecord) -> bool:
    """Whether the process of ``rec`` still runs (same pid and same start time)."""
    ticks = start_ticks(rec.pid)
    return ticks is not None and (rec.start_ticks is None or ticks == rec.start_ticks)


def group_pids(rec: ProcessRecord) -> List[int]:
    """Live processes of the session / process group that ``rec`` leads ([] when its leader's pid now belongs to
    another process: a pid in use as a session or group id is not handed out again, so a live group is ours)."""
    ticks = start_ticks(rec.pid)
    if ticks is not None and rec.start_ticks is not None and ticks != rec.start_ticks:
        return []
    return session_pids(rec.pid)


def stop_recorded(rec: ProcessRecord, timeout: float = 30.0, remove_files: bool = True) -> bool:
    """Stop the process group of ``rec`` (SIGTERM, SIGKILL after ``timeout`` s; it need not be our child) and, with
    ``remove_files``, the ``/dev/shm`` files it held (recorded, and seen now) and its TMPDIR. True when a process
    had to be stopped."""
    pids = group_pids(rec)
    refs: Set[Tuple[int, int]] = {tuple(r) for r in rec.shm}
    if pids:
        refs |= shm_refs_of_session(rec.pid)
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(rec.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            if wait_gone(rec, wait):
                break
    if remove_files:
        remove_shm_files(refs)
        remove_tree(rec.tmpdir)
    return bool(pids)


def wait_gone(rec: ProcessRecord, timeout: float) -> bool:
    """Wait up to ``timeout`` s until no process of ``rec``'s group is left; True when none is."""
    deadline = time.monotonic() + timeout
    while group_pids(rec):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
