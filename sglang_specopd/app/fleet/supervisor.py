"""``specopd fleet start``: N SPECOPD workers from one server config and the ``sglang-router`` in front of them.

:class:`Fleet` is the *supervisor*: it validates everything first (:meth:`Fleet.prepare`: config, target, drafter,
ports, cores, no live fleet in the run directory), starts the workers in parallel (each an
:class:`~sglang_specopd.app.launch.process.SGLangServer`: own session, private TMPDIR, ``/dev/shm`` clean-up, optionally
pinned to its own cores), then the router (:class:`~sglang_specopd.app.fleet.router.RouterProcess`), and keeps
``RUN_DIR/fleet.json`` (:mod:`sglang_specopd.app.fleet.state`) up to date. :meth:`Fleet.stop` stops the router
first, then every worker (idempotent). ``specopd fleet stop`` (another process) SIGTERMs the supervisor, which
stops everything; what a dead supervisor left running is stopped from the state file
(:func:`sglang_specopd.app.fleet.control.stop_fleet`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from sglang_specopd.app.fleet.plan import (FleetError, FleetOptions, RouterSpec, available_cores, plan_cores,
                                           plan_gpus, tp_args, visible_gpus, worker_ports)
from sglang_specopd.app.fleet.state import FleetState, ProcessRecord, Status, start_ticks, write_state
from sglang_specopd.app.launch.pinning import cpu_list


#: what sglang-router 0.3.2 does to SGLang's request extensions (checked in tests/test_fleet_server.py)
ROUTER_DROPS_NOTE = (
    "note: sglang-router drops SGLang's custom_params from /generate and /v1/chat/completions requests (and "
    "return_meta_info from chat): through the router, a request cannot opt out of the traffic spool with "
    "custom_params.specopd_spool=false nor ask for a trace; /v1/completions keeps them, and the workers' own URLs "
    "take them all (docs/fleet.md)")


def connect_host(host: str) -> str:
    """The address the router and clients use for a server listening on ``host`` (a wildcard -> loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


class Fleet:
    """The supervisor of one fleet (see the module docstring). ``say`` gets one line per event."""

    def __init__(self, opts: FleetOptions, say: Callable[[str], None] = lambda line: None):
        self.opts = opts
        self.run_dir = Path(opts.run_dir)
        self.say = say
        self.specs: list = []  # LaunchSpec per worker, set by prepare()
        self.cores: List[Optional[Tuple[int, ...]]] = []
        self.router_spec: Optional[RouterSpec] = None
        self.workers: list = []  # SGLangServer per worker, once started
        self.router = None  # RouterProcess
        self._starts: List[Future] = []
        self._pool: Optional[ThreadPoolExecutor] = None
        self._records: dict = {}  # (role, index) -> the last ProcessRecord seen while the process ran
        self.status: Status = "starting"
        self.message = ""
        self.started_at = time.time()
        self.config_name = opts.config

    # ----------------------------------------------------------------------------------------------- preparing
    def prepare(self) -> "Fleet":
        """Check everything that can be checked before a process starts; raises :class:`FleetError` (or the
        serve path's ``ConfigError`` / ``ServeError``) with one readable message."""
        from sglang_specopd.app.config import ServeConfig
        from sglang_specopd.app.fleet.control import check_no_live_fleet
        from sglang_specopd.app.launch.process import check_port_free, free_port
        from sglang_specopd.app.serve.spec import config_path, launch_spec

        import importlib.util

        o = self.opts
        if importlib.util.find_spec("sglang_router") is None:
            raise FleetError("the router is not installed: pip install 'sglang-specopd[fleet]' (sglang-router==0.3.2)")
        check_no_live_fleet(self.run_dir)
        cfg = ServeConfig.load(config_path(o.config))
        self.config_name = cfg.name
        ports = worker_ports(o.workers, o.port, o.worker_base_port)
        per_worker = o.gpus_per_worker if o.gpus_per_worker is not None else o.tp_size
        extra = list(o.sglang_args) + tp_args(o.tp_size, per_worker, [*cfg.extra_sglang_args, *o.sglang_args])
        gpus = plan_gpus(o.workers, per_worker, visible_gpus())
        check_port_free(o.host, o.port)
        self.specs = [replace(launch_spec(cfg, host=o.host, port=p, api_key=o.api_key, admin_api_key=o.admin_api_key,
                                          drafter=o.drafter, extra_args=extra), cuda_visible_devices=g)
                      for p, g in zip(ports, gpus)]
        self.cores = list(plan_cores(o.workers, available_cores())) if o.pin_cores else [None] * o.workers
        if cfg.traffic_spool_mb > 0:
            self.say(ROUTER_DROPS_NOTE)
        host = connect_host(o.host)
        self.router_spec = RouterSpec(
            worker_urls=tuple(f"http://{host}:{p}" for p in ports), host=o.host, port=o.port,
            prometheus_port=free_port(host), policy=o.policy, api_key=o.api_key,
            startup_timeout_s=int(o.timeout), extra_args=tuple(o.router_args))
        return self

    @property
    def router_url(self) -> str:
        return f"http://{connect_host(self.opts.host)}:{self.opts.port}"

    # ----------------------------------------------------------------------------------------------- starting
    def start(self) -> "Fleet":
        """Start the workers (in parallel), wait until each is healthy, then the router, until it reports them all
        healthy. On any failure raises; the caller must call :meth:`stop` (``with fleet:`` does)."""
        from sglang_specopd.app.fleet.router import RouterProcess
        from sglang_specopd.app.launch.process import SGLangServer

        if not self.specs:
            self.prepare()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.write()
        self.workers = [SGLangServer(spec, log_path=self.run_dir / f"worker-{i}.log",
                                     cpu_cores=list(self.cores[i]) if self.cores[i] else None)
                        for i, spec in enumerate(self.specs)]
        for i, w in enumerate(self.workers):
            pinned = f", cores {cpu_list(self.cores[i])}" if self.cores[i] else ""
            pinned += f", GPUs {w.spec.cuda_visible_devices}" if w.spec.cuda_visible_devices is not None else ""
            self.say(f"worker {i}: starting {w.url}{pinned}; log {w.log_path}")
        self._pool = ThreadPoolExecutor(max_workers=len(self.workers), thread_name_prefix="fleet-start")
        self._starts = [self._pool.submit(w.start, self.opts.timeout) for w in self.workers]
        while True:  # the pids go into the state file as soon as each worker is launched
            done, pending = wait(self._starts, timeout=2.0)
            self.write()
            if not pending or any(f.exception() is not None for f in done):
                break
        for i, f in enumerate(self._starts):
            if f.done() and f.exception() is not None:
                raise FleetError(f"worker {i} ({self.workers[i].url}) did not start: {f.exception()}")
        for i, w in enumerate(self.workers):
            self.say(f"worker {i}: healthy after {w.time_to_healthy_s:.1f} s")
        self.router = RouterProcess(self.router_spec, self.run_dir / "router.log").launch()
        self.say(f"router: starting {self.router.url} (policy {self.router_spec.policy}); log {self.router.log_path}")
        self.write()
        ready = self.router.wait_ready(len(self.workers), self.opts.timeout)
        self.status, self.message = "ready", f"router ready: {ready.get('healthy_workers')} healthy workers"
        self.refresh_files()
        self.write()
        return self

    def refresh_files(self) -> None:
        """Record the ``/dev/shm`` files the workers' processes hold now (kept in the state file, so a
        ``fleet stop`` after the supervisor died still removes them)."""
        for w in self.workers:
            if w.proc is not None:
                w.record_shm_refs()

    # ----------------------------------------------------------------------------------------------- running
    def supervise(self, poll_s: float = 2.0, refresh_s: float = 30.0) -> None:
        """Watch the fleet until the router exits or every worker has (raises :class:`FleetError`); a worker that
        exits is reported once (the router stops sending it requests when its health checks fail). Ctrl-C /
        SIGTERM (raised as KeyboardInterrupt by the CLI) ends it; the caller then calls :meth:`stop`."""
        dead: set = set()
        next_refresh = time.monotonic() + refresh_s
        while True:
            if self.router is None or self.router.proc is None or self.router.proc.poll() is not None:
                code = None if self.router is None or self.router.proc is None else self.router.proc.returncode
                raise FleetError(f"the router exited with code {code}; log {self.router.log_path if self.router else '-'}")
            for i, w in enumerate(self.workers):
                if i not in dead and (w.proc is None or w.proc.poll() is not None):
                    dead.add(i)
                    code = None if w.proc is None else w.proc.returncode
                    self.message = f"worker {i} exited with code {code}; log {w.log_path}"
                    self.say(f"warning: {self.message}")
                    self.write()
            if len(dead) == len(self.workers):
                raise FleetError("every worker has exited")
            if time.monotonic() >= next_refresh:
                self.refresh_files()
                self.write()
                next_refresh = time.monotonic() + refresh_s
            time.sleep(poll_s)

    # ----------------------------------------------------------------------------------------------- stopping
    def stop(self, timeout: float = 30.0) -> None:
        """Stop the router, then every worker (in parallel); remove what they left. Idempotent."""
        if self.status == "stopped":
            return
        self.status = "stopping"
        self.write()
        if self.router is not None:
            self.router.stop()
        if self.workers:
            with ThreadPoolExecutor(max_workers=len(self.workers), thread_name_prefix="fleet-stop") as pool:
                list(pool.map(lambda w: _stop_quietly(w, timeout), self.workers))
        deadline = time.monotonic() + timeout
        while any(not f.done() for f in self._starts) and time.monotonic() < deadline:
            for w in self.workers:  # a worker launched while we were stopping (its start thread) is stopped too
                _stop_quietly(w, timeout)
            wait(self._starts, timeout=0.5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self.status = "stopped" if self.status == "stopping" else self.status
        self.write()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------------------------------------------- state file
    def _record(self, role: str, index: int, proc, **fields) -> Optional[ProcessRecord]:
        """The record of a process (its pid and start time as last seen while it ran, ``fields`` as now)."""
        key = (role, index)
        if proc is not None and (key not in self._records or self._records[key].pid != proc.pid):
            self._records[key] = ProcessRecord(role=role, index=index, pid=proc.pid, start_ticks=start_ticks(proc.pid))
        rec = self._records.get(key)
        return None if rec is None else rec.model_copy(update=fields)

    def state(self) -> FleetState:
        workers = []
        for i, w in enumerate(self.workers):
            rec = self._record("worker", i, w.proc, url=w.url, log=str(w.log_path), tmpdir=w.tmpdir,
                               cores=self.cores[i], shm=tuple(sorted(w.shm_refs)))
            if rec is not None:
                workers.append(rec)
        router = None
        if self.router is not None:
            router = self._record("router", 0, self.router.proc, url=self.router_url, log=str(self.router.log_path),
                                  tmpdir=self.router.tmpdir)
        me = ProcessRecord(role="supervisor", pid=os.getpid(), start_ticks=start_ticks(os.getpid()))
        return FleetState(status=self.status, config=self.config_name, host=self.opts.host, router_url=self.router_url,
                          supervisor=me, router=router, workers=tuple(workers), api_key_set=bool(self.opts.api_key),
                          admin_key_set=bool(self.opts.admin_api_key), started_at=self.started_at,
                          updated_at=time.time(), message=self.message)

    def write(self) -> None:
        write_state(self.run_dir, self.state())


def _stop_quietly(server, timeout: float) -> None:
    try:
        server.stop(timeout=timeout)
    except (AttributeError, OSError):  # a start thread stopped it at the same moment
        pass
