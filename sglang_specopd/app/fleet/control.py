"""Controlling a fleet from another process: ``specopd fleet stop``, ``specopd fleet start --detach``, and the
check that a run directory holds no live fleet before a new one starts there.

:func:`stop_fleet` is idempotent: it SIGTERMs the supervisor (which stops the router, then the workers, and
removes what they left), then stops from ``fleet.json`` whatever is still running (a supervisor killed with
``kill -9``, or one that did not finish in time) and removes the ``/dev/shm`` files and TMPDIRs recorded for the
processes that were not stopped cleanly. Stopping a stopped fleet changes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from sglang_specopd.app.fleet.plan import FleetError, FleetOptions
from sglang_specopd.app.fleet.state import (FleetState, group_pids, is_alive, read_state, state_path, stop_recorded,
                                            write_state)

API_KEY_ENV = "SPECOPD_API_KEY"  # the same names the trainer's --api-key / --admin-key read
ADMIN_KEY_ENV = "SPECOPD_ADMIN_KEY"


def live_processes(state: FleetState) -> List[str]:
    """``role pid`` of every process of ``state`` that still runs: the supervisor, and each group with live processes
    (``worker 0 pid 123: 3 processes``)."""
    out = [f"supervisor pid {state.supervisor.pid}"] if is_alive(state.supervisor) else []
    for rec in ([state.router] if state.router else []) + list(state.workers):
        name = "router" if rec.role == "router" else f"worker {rec.index}"
        pids = group_pids(rec)
        if pids:
            out.append(f"{name} pid {rec.pid}: {len(pids)} process{'es' if len(pids) > 1 else ''}")
    return out


def check_no_live_fleet(run_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`FleetError` when a process of the fleet recorded in ``run_dir`` still runs. The files of a
    fleet whose processes all died without a clean stop are removed here."""
    state = read_state(run_dir)
    if state is None:
        return
    live = live_processes(state)
    if live:
        raise FleetError(f"a fleet is running from {state_path(run_dir)} ({', '.join(live[:4])}); stop it with "
                         f"`specopd fleet stop --run-dir {run_dir}` or pick another --run-dir")
    if state.status != "stopped":
        stop_fleet(run_dir)


def stop_fleet(run_dir: str | os.PathLike[str], timeout: float = 90.0) -> List[str]:
    """Stop the fleet recorded in ``run_dir`` (see the module docstring); one line per thing done.

    Raises:
        FleetError: no ``fleet.json`` in ``run_dir``.
    """
    state = read_state(run_dir)
    if state is None:
        raise FleetError(f"no fleet in {run_dir} (no {state_path(run_dir).name})")
    lines: List[str] = []
    sup = state.supervisor
    if is_alive(sup):
        os.kill(sup.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while is_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
        if is_alive(sup):
            os.kill(sup.pid, signal.SIGKILL)
            lines.append(f"supervisor pid {sup.pid}: did not exit within {timeout:.0f} s, killed")
        else:
            lines.append(f"supervisor pid {sup.pid}: stopped")
        state = read_state(run_dir) or state  # what the supervisor wrote last
    clean = state.status == "stopped"
    for rec in ([state.router] if state.router else []) + list(state.workers):
        name = "router" if rec.role == "router" else f"worker {rec.index}"
        running = bool(group_pids(rec))
        if running or not clean:  # a clean stop removed the files already (an inode may be reused since)
            if stop_recorded(rec, timeout=30.0, remove_files=True):
                lines.append(f"{name} pid {rec.pid}: stopped")
    if not lines:
        lines.append(f"fleet in {run_dir} already stopped")
    if not clean or state.status != "stopped":
        write_state(run_dir, state.model_copy(update={"status": "stopped", "updated_at": time.time(),
                                                      "message": "stopped by `specopd fleet stop`"}))
    return lines


def cli_argv(opts: FleetOptions) -> List[str]:
    """The ``specopd fleet start`` arguments that start ``opts`` in the foreground (keys excluded: they travel in
    :data:`API_KEY_ENV` / :data:`ADMIN_KEY_ENV`, not on a command line other users can read)."""
    a = ["fleet", "start", "--config", opts.config, "--workers", str(opts.workers), "--run-dir", str(opts.run_dir),
         "--host", opts.host, "--port", str(opts.port), "--policy", opts.policy, "--timeout", str(opts.timeout)]
    if opts.worker_base_port is not None:
        a += ["--worker-base-port", str(opts.worker_base_port)]
    if opts.pin_cores:
        a.append("--pin-cores")
    for flag, value in (("--gpus-per-worker", opts.gpus_per_worker), ("--tp-size", opts.tp_size)):
        if value is not None:
            a += [flag, str(value)]
    if opts.drafter:
        a += ["--drafter", opts.drafter]
    a += [f"--sglang-arg={x}" for x in opts.sglang_args]
    a += [f"--router-arg={x}" for x in opts.router_args]
    return a


def start_detached(opts: FleetOptions, poll_s: float = 0.5) -> FleetState:
    """Run ``specopd fleet start`` (foreground) as a background supervisor in its own session, its output in
    ``RUN_DIR/fleet.log``; return its state once the fleet is ready. Raises :class:`FleetError` (with the log's
    tail) when it fails or is not ready within ``opts.timeout`` (plus a margin); it is stopped then."""
    run_dir = Path(opts.run_dir)
    check_no_live_fleet(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "fleet.log"
    env = dict(os.environ)
    for name, value in ((API_KEY_ENV, opts.api_key), (ADMIN_KEY_ENV, opts.admin_api_key)):
        env.pop(name, None)
        if value:
            env[name] = value
    with open(log_path, "ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "sglang_specopd.app.cli", *cli_argv(opts)], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    deadline = time.monotonic() + 2 * opts.timeout + 120  # the workers' timeout, then the router's
    while time.monotonic() < deadline:
        state = _own_state(run_dir, child.pid)
        if state is not None and state.status == "ready":
            return state
        if child.poll() is not None:
            raise FleetError(f"`specopd fleet start` exited with code {child.returncode}; log {log_path}:\n"
                             f"{_tail(log_path)}")
        time.sleep(poll_s)
    stop_fleet(run_dir)
    raise FleetError(f"the fleet was not ready in time; stopped it; log {log_path}:\n{_tail(log_path)}")


def _own_state(run_dir: Path, pid: int) -> Optional[FleetState]:
    try:
        state = read_state(run_dir)
    except FleetError:  # never half-written (atomic), but a foreign file may be there
        return None
    return state if state is not None and state.supervisor.pid == pid else None


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
