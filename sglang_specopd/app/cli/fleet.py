"""``specopd fleet start | status | stop``: N SPECOPD workers from one server config behind ``sglang-router``.

``start`` runs in the foreground like ``specopd serve`` (and SGLang's own launchers): Ctrl-C, SIGTERM or SIGHUP stop
the router and every worker; ``--detach`` runs the same supervisor in the background and returns once the fleet is
ready. Either way ``specopd fleet stop --run-dir DIR`` stops everything it started. See ``docs/fleet.md``.
"""

from __future__ import annotations

import json
import signal
from typing import List, Optional

import typer

from sglang_specopd.app.cli.apps import fleet_app
from sglang_specopd.app.fleet.plan import DEFAULT_POLICY, ROUTER_POLICIES

RUN_DIR_HELP = "Directory of the fleet's state file (fleet.json) and logs."


@fleet_app.command("start")
def start(
    config: str = typer.Option(..., "--config", "-c", help="Server config of every worker: a YAML path or a name in "
                                                           "server_configs/."),
    workers: int = typer.Option(..., "--workers", "-n", min=1, help="How many workers (SGLang servers)."),
    run_dir: str = typer.Option("runs/fleet", "--run-dir", help=RUN_DIR_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Where the router and the workers listen."),
    port: int = typer.Option(30000, "--port", help="The router's port (clients send requests here)."),
    worker_base_port: Optional[int] = typer.Option(None, "--worker-base-port", help="Worker i listens on this + i "
                                                   "(default: --port + 1)."),
    pin_cores: bool = typer.Option(False, "--pin-cores", help="Pin worker i to its own slice of this process's CPU "
                                   "cores (core i mod ncores when there are fewer cores than workers)."),
    gpus_per_worker: Optional[int] = typer.Option(None, "--gpus-per-worker", min=1, help="GPUs of each worker: "
                                                  "worker i gets GPUs i*N..i*N+N-1 (its CUDA_VISIBLE_DEVICES, of "
                                                  "this shell's list when set). Default: --tp-size when given."),
    tp_size: Optional[int] = typer.Option(None, "--tp-size", min=1, help="Every worker's tensor-parallel size "
                                          "(SGLang's --tp-size; at most --gpus-per-worker)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SPECOPD_API_KEY", help="Every worker's "
                                          "--api-key; the router then asks clients for it too."),
    admin_api_key: Optional[str] = typer.Option(None, "--admin-api-key", envvar="SPECOPD_ADMIN_KEY",
                                                help="Every worker's admin key (drafter swap / rollout, spool)."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="Override the config's drafter directory."),
    policy: str = typer.Option(DEFAULT_POLICY, "--policy", help=f"Router policy: {', '.join(ROUTER_POLICIES)}."),
    sglang_arg: List[str] = typer.Option([], "--sglang-arg", help="Extra SGLang flag for every worker, repeatable."),
    router_arg: List[str] = typer.Option([], "--router-arg", help="Extra sglang_router.launch_router flag, "
                                         "repeatable: --router-arg=--health-check-interval-secs=10"),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds for the workers (then the router) to become "
                                                           "healthy."),
    detach: bool = typer.Option(False, "--detach", help="Run in the background; return once the fleet is ready."),
) -> None:
    """Start N workers and the router in front of them; keep running until Ctrl-C (or `specopd fleet stop`)."""
    from sglang_specopd.app.config import ConfigError
    from sglang_specopd.app.fleet.supervisor import Fleet
    from sglang_specopd.app.fleet.plan import FleetError, FleetOptions
    from sglang_specopd.app.launch.process import ServeError

    opts = FleetOptions(config=config, workers=workers, run_dir=run_dir, host=host, port=port,
                        worker_base_port=worker_base_port, pin_cores=pin_cores, gpus_per_worker=gpus_per_worker,
                        tp_size=tp_size, api_key=api_key,
                        admin_api_key=admin_api_key, drafter=drafter, policy=policy, sglang_args=tuple(sglang_arg),
                        router_args=tuple(router_arg), timeout=timeout)
    if detach:
        from sglang_specopd.app.fleet.control import start_detached

        try:
            Fleet(opts, say=lambda line: typer.echo(line, err=True)).prepare()  # bad input: one line, here
            state = start_detached(opts)
        except (FleetError, ConfigError, ServeError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=2)
        typer.echo(f"ready: router {state.router_url} -> {len(state.workers)} workers "
                   f"({', '.join(state.worker_urls)}); supervisor pid {state.supervisor.pid}, log "
                   f"{run_dir}/fleet.log; stop: specopd fleet stop --run-dir {run_dir}")
        return
    fleet = Fleet(opts, say=lambda line: typer.echo(line, err=True))
    try:
        fleet.prepare()
    except (FleetError, ConfigError, ServeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    code = 0
    try:
        fleet.start()
        typer.echo(f"ready: router {fleet.router_url} -> {workers} workers; Ctrl-C or "
                   f"`specopd fleet stop --run-dir {run_dir}` stops them", err=True)
        fleet.supervise()
    except (FleetError, ServeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        fleet.status, fleet.message, code = "failed", str(exc).splitlines()[0], 1
    except KeyboardInterrupt:
        typer.echo("stopping the fleet", err=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        fleet.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        typer.echo("fleet stopped", err=True)
    if code:
        raise typer.Exit(code=code)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@fleet_app.command("status")
def status(
    run_dir: str = typer.Option("runs/fleet", "--run-dir", help=RUN_DIR_HELP),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SPECOPD_API_KEY", help="The workers' --api-key."),
    admin_key: Optional[str] = typer.Option(None, "--admin-key", envvar="SPECOPD_ADMIN_KEY",
                                            help="The workers' admin key (shows the traffic spool)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Each worker's health, drafter version and spool, and the router's readiness; exit 1 unless all is well."""
    from sglang_specopd.app.fleet.plan import FleetError
    from sglang_specopd.app.fleet.status import fleet_status, status_lines

    try:
        st = fleet_status(run_dir, api_key=api_key, admin_key=admin_key)
    except FleetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    typer.echo(json.dumps(st, indent=2) if as_json else "\n".join(status_lines(st)))
    if not st["ok"]:
        raise typer.Exit(code=1)


@fleet_app.command("stop")
def stop(
    run_dir: str = typer.Option("runs/fleet", "--run-dir", help=RUN_DIR_HELP),
    timeout: float = typer.Option(90.0, "--timeout", help="Seconds the supervisor gets to stop everything before "
                                                          "the processes are killed from the state file."),
) -> None:
    """Stop everything the fleet started (router first, then the workers; no orphans, no /dev/shm leftovers)."""
    from sglang_specopd.app.fleet.control import stop_fleet
    from sglang_specopd.app.fleet.plan import FleetError

    try:
        lines = stop_fleet(run_dir, timeout=timeout)
    except FleetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    for line in lines:
        typer.echo(line)
