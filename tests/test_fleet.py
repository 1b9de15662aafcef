"""``specopd fleet`` without servers: ports, core pinning, the router's command, the state file, and ``fleet stop``
on stand-in processes (process groups of ``sleep``, one holding a ``/dev/shm`` file): everything stopped, the file
removed, a second stop changing nothing, a reused pid never signalled. The fleet on real workers:
``tests/test_fleet_server.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sglang_specopd.app.fleet.control import check_no_live_fleet, cli_argv, stop_fleet
from sglang_specopd.app.fleet.plan import (FleetError, FleetOptions, RouterSpec, plan_cores, plan_gpus, router_argv,
                                           tp_args, visible_gpus, worker_ports)
from sglang_specopd.app.launch.pinning import cpu_list, pinned_argv
from sglang_specopd.app.fleet.state import (FleetState, ProcessRecord, is_alive, read_state, start_ticks,
                                            state_path, write_state)
from sglang_specopd.app.launch.pinning import cpu_list, pinned_argv


def test_worker_ports_follow_the_router_port_or_the_base() -> None:
    assert worker_ports(3, 30000) == [30001, 30002, 30003]
    assert worker_ports(2, 30000, base=31000) == [31000, 31001]
    with pytest.raises(FleetError, match="also a worker's port"):
        worker_ports(2, 31001, base=31000)
    with pytest.raises(FleetError, match="outside 1..65535"):
        worker_ports(2, 30000, base=65535)
    with pytest.raises(FleetError, match="at least 1"):
        worker_ports(0, 30000)


def test_cores_are_split_in_contiguous_slices_or_shared_round_robin() -> None:
    assert plan_cores(2, range(8)) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert plan_cores(3, range(8)) == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert plan_cores(2, [5, 3, 3]) == [(3,), (5,)]
    assert plan_cores(5, [0, 1]) == [(0,), (1,), (0,), (1,), (0,)]
    with pytest.raises(FleetError):
        plan_cores(2, [])
    assert cpu_list([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu_list([4]) == "4"


def test_a_pinned_command_runs_on_its_cores_only() -> None:
    core = sorted(os.sched_getaffinity(0))[-1]
    argv = pinned_argv([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], [core])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == [core]


def test_router_command() -> None:
    spec = RouterSpec(worker_urls=("http://127.0.0.1:30001", "http://127.0.0.1:30002"), port=30000,
                      prometheus_port=29123, policy="round_robin", extra_args=("--health-check-interval-secs", "5"))
    argv = router_argv(spec, python="py")
    assert argv[:3] == ["py", "-m", "sglang_router.launch_router"]
    i = argv.index("--worker-urls")
    assert argv[i + 1:i + 3] == list(spec.worker_urls)
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--port"] == "30000" and pairs["--prometheus-port"] == "29123" and pairs["--policy"] == "round_robin"
    assert "--api-key" not in argv and argv[-2:] == ["--health-check-interval-secs", "5"]
    keyed = router_argv(RouterSpec(worker_urls=("http://h:1",), api_key="key-z9"), python="py")
    assert keyed[keyed.index("--api-key") + 1] == "key-z9" and "z9" not in repr(RouterSpec(("u",), api_key="key-z9"))
    with pytest.raises(FleetError, match="unknown router policy"):
        router_argv(RouterSpec(worker_urls=("http://h:1",), policy="fastest"))
    with pytest.raises(FleetError, match="at least one worker"):
        router_argv(RouterSpec(worker_urls=()))


def test_the_detached_command_line_has_every_option_and_no_key() -> None:
    from typer.main import get_command

    from sglang_specopd.app.cli.entry import _register_subcommands, fleet_app

    _register_subcommands()
    opts = FleetOptions(config="cpu-smollm2", workers=3, run_dir="runs/f", host="0.0.0.0", port=31000,
                        worker_base_port=32000, pin_cores=True, gpus_per_worker=2, tp_size=2,
                        api_key="secret-a", admin_api_key="secret-b",
                        drafter="/d", policy="round_robin", sglang_args=("--log-level=debug",),
                        router_args=("--health-check-interval-secs=5",), timeout=60.0)
    argv = cli_argv(opts)
    assert argv[:2] == ["fleet", "start"] and not any("secret" in a for a in argv)
    assert "secret" not in repr(opts)
    ctx = get_command(fleet_app).commands["start"].make_context("start", argv[2:])
    p = ctx.params
    assert (p["config"], p["workers"], p["run_dir"], p["host"], p["port"], p["worker_base_port"], p["pin_cores"],
            p["drafter"], p["policy"], p["timeout"], p["detach"]) == (
        "cpu-smollm2", 3, "runs/f", "0.0.0.0", 31000, 32000, True, "/d", "round_robin", 60.0, False)
    assert p["sglang_arg"] == ["--log-level=debug"] and p["router_arg"] == ["--health-check-interval-secs=5"]
    assert (p["gpus_per_worker"], p["tp_size"]) == (2, 2)


def test_gpus_per_worker_are_consecutive_slices() -> None:
    """Issue 54: worker i gets GPUs i*N..i*N+N-1, of the supervisor's CUDA_VISIBLE_DEVICES list when set."""
    assert plan_gpus(3, 2) == ["0,1", "2,3", "4,5"] and plan_gpus(2, None) == [None, None]
    assert plan_gpus(2, 1, ["4", "6", "7"]) == ["4", "6"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4, 5,6,7"}) == ["4", "5", "6", "7"] and visible_gpus({}) is None
    with pytest.raises(FleetError, match="needs 6 GPUs; CUDA_VISIBLE_DEVICES lists 4"):
        plan_gpus(3, 2, ["0", "1", "2", "3"])
    with pytest.raises(FleetError, match="--gpus-per-worker must be at least 1"):
        plan_gpus(2, 0)


def test_tp_size_is_passed_to_every_worker_and_checked() -> None:
    assert tp_args(2, 2, ["--log-level", "info"]) == ["--tp-size", "2"]
    assert tp_args(None, None, ["--tp-size", "4"]) == [] and tp_args(4, 4, ["--tp-size=4"]) == []
    with pytest.raises(FleetError, match="conflicts with --tp-size 4"):
        tp_args(2, None, ["--tp-size", "4"])
    with pytest.raises(FleetError, match="--tp-size 4 needs 4 GPUs per worker; --gpus-per-worker is 2"):
        tp_args(4, 2, [])
    with pytest.raises(FleetError, match="--tp-size 4 needs 4 GPUs"):  # the config's own --tp-size too
        tp_args(None, 2, ["--tp-size", "4"])


def test_fleet_plan_gives_each_worker_its_gpus_and_tp_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fleet.prepare (nothing started): each worker's LaunchSpec carries its CUDA_VISIBLE_DEVICES and --tp-size;
    --gpus-per-worker defaults to --tp-size."""
    from sglang_specopd.app.serve import spec as serve
    from sglang_specopd.app.fleet.supervisor import Fleet
    from sglang_specopd.app.launch.process import LaunchSpec, free_port

    monkeypatch.setattr(serve, "launch_spec", lambda cfg, host, port, extra_args, **kw: LaunchSpec(
        model_path=cfg.target, host=host, port=port, extra_args=list(cfg.extra_sglang_args) + list(extra_args)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,4,5,6,7")
    port = free_port()
    fleet = Fleet(FleetOptions(config="gpu-qwen3-8b-dflash", workers=3, run_dir=str(tmp_path / "f"), port=port,
                               worker_base_port=port + 10, tp_size=2)).prepare()
    assert [s.cuda_visible_devices for s in fleet.specs] == ["2,3", "4,5", "6,7"]
    for spec in fleet.specs:
        argv = spec.argv()
        assert argv[argv.index("--tp-size") + 1] == "2"
    with pytest.raises(FleetError, match="needs 8 GPUs"):
        Fleet(FleetOptions(config="gpu-qwen3-8b-dflash", workers=4, run_dir=str(tmp_path / "g"), port=port,
                           worker_base_port=port + 10, gpus_per_worker=2)).prepare()


def _record(role: str, proc: subprocess.Popen, index: int = 0, **kw) -> ProcessRecord:
    return ProcessRecord(role=role, index=index, pid=proc.pid, start_ticks=start_ticks(proc.pid), **kw)


def _state(tmp_path: Path, supervisor: ProcessRecord, router=None, workers=(), status="ready") -> FleetState:
    now = time.time()
    return FleetState(status=status, config="tiny", host="127.0.0.1", router_url="http://127.0.0.1:1",
                      supervisor=supervisor, router=router, workers=tuple(workers), started_at=now, updated_at=now)


def test_state_file_round_trip_is_atomic_and_strict(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    me = ProcessRecord(role="supervisor", pid=os.getpid(), start_ticks=start_ticks(os.getpid()))
    w = ProcessRecord(role="worker", index=1, pid=1, url="http://127.0.0.1:2", cores=(0, 1), shm=((1, 2),))
    state = _state(tmp_path, me, workers=[w])
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state and state.worker_urls == ["http://127.0.0.1:2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.json"]  # no temporary file left
    assert is_alive(me) and not is_alive(me.model_copy(update={"start_ticks": (me.start_ticks or 0) + 1}))
    state_path(tmp_path).write_text(json.dumps({"status": "ready"}))
    with pytest.raises(FleetError, match="not a fleet state file"):
        read_state(tmp_path)


def _group(cmd: str) -> subprocess.Popen:
    """A stand-in server: a shell in its own session with a child ``sleep`` (a process group of two)."""
    return subprocess.Popen(["bash", "-c", cmd], start_new_session=True, stdin=subprocess.DEVNULL)


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_stop_stops_every_group_removes_shm_and_is_idempotent(tmp_path: Path) -> None:
    from sglang_specopd.app.launch.cleanup import session_pids

    shm = Path("/dev/shm") / f"specopd-test-fleet-{uuid.uuid4().hex[:8]}"
    procs = [_group(f"exec 3>{shm}; sleep 300 & wait"), _group("sleep 300 & wait"), _group("sleep 300 & wait")]
    dead_supervisor = subprocess.Popen(["true"])
    dead_supervisor.wait()
    try:
        _wait(lambda: shm.exists() and all(len(session_pids(p.pid)) == 2 for p in procs))
        st = shm.stat()
        tmpdir = tmp_path / "specopd-sglang-w0"
        tmpdir.mkdir()
        workers = [_record("worker", procs[0], 0, shm=((st.st_dev, st.st_ino),), tmpdir=str(tmpdir)),
                   _record("worker", procs[1], 1)]
        state = _state(tmp_path, ProcessRecord(role="supervisor", pid=dead_supervisor.pid),
                       router=_record("router", procs[2]), workers=workers)
        write_state(tmp_path, state)
        with pytest.raises(FleetError, match="a fleet is running"):
            check_no_live_fleet(tmp_path)
        lines = stop_fleet(tmp_path, timeout=5)
        assert lines == [f"router pid {procs[2].pid}: stopped", f"worker 0 pid {procs[0].pid}: stopped",
                         f"worker 1 pid {procs[1].pid}: stopped"]
        for p in procs:
            p.wait(timeout=10)
            _wait(lambda: not session_pids(p.pid))
        assert not shm.exists() and not tmpdir.exists()
        assert read_state(tmp_path).status == "stopped"
        assert stop_fleet(tmp_path) == [f"fleet in {tmp_path} already stopped"]
        check_no_live_fleet(tmp_path)  # a stopped fleet does not block a new one
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        shm.unlink(missing_ok=True)


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    other = _group("sleep 300 & wait")
    try:
        _wait(lambda: start_ticks(other.pid) is not None)
        stale = ProcessRecord(role="worker", pid=other.pid, start_ticks=start_ticks(other.pid) - 1)
        write_state(tmp_path, _state(tmp_path, ProcessRecord(role="supervisor", pid=other.pid, start_ticks=1),
                                     workers=[stale], status="failed"))
        check_no_live_fleet(tmp_path)  # neither the "supervisor" nor the "worker" counts as ours
        assert stop_fleet(tmp_path) == [f"fleet in {tmp_path} already stopped"]
        assert other.poll() is None
    finally:
        os.killpg(other.pid, 9)
        other.wait()


def test_status_and_stop_without_a_fleet_fail_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    for cmd in ("status", "stop"):
        res = CliRunner().invoke(app, ["fleet", cmd, "--run-dir", str(tmp_path)])
        assert res.exit_code == 2 and "error: no fleet in" in res.output, res.output


@pytest.mark.parametrize("detach", [False, True])
def test_start_refuses_bad_input_in_one_line_before_starting_anything(tmp_path: Path, detach: bool) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    base = ["fleet", "start", "--run-dir", str(tmp_path), "--workers", "2"] + (["--detach"] if detach else [])
    res = CliRunner().invoke(app, base + ["--config", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "error: server config not found" in res.output, res.output
    res = CliRunner().invoke(app, base + ["--config", "cpu-smollm2", "--port", "31000", "--worker-base-port", "30999"])
    assert res.exit_code == 2 and "also a worker's port" in res.output, res.output
    assert not (tmp_path / "fleet.json").exists()


def test_status_of_a_fleet_that_does_not_answer(tmp_path: Path) -> None:
    from sglang_specopd.app.fleet.status import fleet_status, status_lines
    from sglang_specopd.app.launch.process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    w = ProcessRecord(role="worker", pid=1, start_ticks=0, url=url)
    state = _state(tmp_path, ProcessRecord(role="supervisor", pid=1, start_ticks=0), workers=[w])
    write_state(tmp_path, state.model_copy(update={"router_url": f"http://127.0.0.1:{free_port()}"}))
    st = fleet_status(tmp_path, admin_key="k", timeout=2)
    assert not st["ok"] and st["router"]["readiness"] is None
    assert st["workers"][0]["healthy"] is False and "unreachable" in st["workers"][0]["drafter"]["error"]
    text = "\n".join(status_lines(st))
    assert "UNHEALTHY" in text and "not answering" in text and text.endswith("NOT ok (drafter versions unknown)")
    assert fleet_status(tmp_path, timeout=2)["workers"][0]["spool"] == {"state": "admin key needed"}
