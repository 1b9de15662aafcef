"""The fleet benchmark's phases against real workers (``benchmarks/fleetbench/run.py`` runs them; numbers in :mod:`.stats`).

* :func:`started_fleet`: ``n`` SPECOPD workers of one config behind sglang-router with the fleet's own supervisor
  (:class:`sglang_specopd.app.fleet.supervisor.Fleet`, as ``specopd fleet start``), worker ``i`` pinned to the one core
  ``cores[i]`` (``--pin-cores`` would give a lone worker every core: the 1-worker arm must have one core too);
* :func:`measure_level`: every held-out prompt once through the router with ``c`` requests in flight
  (``specopd bench serve``'s streaming client), every worker's ``/flush_cache`` first;
* :func:`measure_rollouts`: ``FleetRollout`` transactions while :class:`~.load.VersionLoad` keeps the router (and
  each worker directly) busy; every response's drafter versions checked against the commits;
* :func:`kill_scenario`: the same, with ``kill -9`` of one worker's whole process group just before its stage or
  its commit request; then (``rejoin``) the worker restarted on its port and cores and ``FleetRollout.reconcile``d.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from fleetbench import stats

Say = Callable[[str], None]


def consecutive_free_ports(n: int) -> int:
    """A port ``p`` with ``p .. p + n - 1`` free now."""
    from sglang_specopd.app.launch.process import PortInUseError, check_port_free, free_port

    for _ in range(200):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for i in range(n):
                check_port_free("127.0.0.1", base + i)
        except PortInUseError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


@contextlib.contextmanager
def started_fleet(config: str, n: int, cores: Sequence[int], *, drafter: Optional[str], run_dir: Path,
                  admin_key: str, policy: str, router_args: Sequence[str], timeout: float,
                  say: Say) -> Iterator[Any]:
    """A ready :class:`~sglang_specopd.app.fleet.supervisor.Fleet` of ``n`` workers (worker ``i`` on core ``cores[i]``); stopped
    (router, then workers, their files removed) on exit."""
    from sglang_specopd.app.fleet.supervisor import Fleet
    from sglang_specopd.app.fleet.plan import FleetOptions
    from sglang_specopd.app.launch.process import free_port

    if len(cores) < n:
        raise ValueError(f"{n} workers need {n} cores, got {list(cores)}")
    port = free_port()
    base = consecutive_free_ports(n)
    while port in range(base, base + n):
        port = free_port()
    opts = FleetOptions(config=config, workers=n, run_dir=str(run_dir), port=port, worker_base_port=base,
                        admin_api_key=admin_key, drafter=drafter, policy=policy, router_args=tuple(router_args),
                        timeout=timeout)
    fleet = Fleet(opts, say=lambda line: say(f"  fleet: {line}")).prepare()
    fleet.cores = [(int(c),) for c in cores[:n]]
    with fleet:
        t0 = time.monotonic()
        fleet.start()
        fleet.start_s = time.monotonic() - t0
        yield fleet


def flush_workers(urls: Sequence[str], admin_key: Optional[str]) -> bool:
    """``POST /flush_cache`` on every worker (SGLang's radix cache) with the admin key (SGLang asks for it on this
    route when the server has one; the router has no admin key to send). True if every worker flushed."""
    import httpx

    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    ok = True
    for u in urls:
        try:
            ok &= httpx.post(u + "/flush_cache", headers=headers, timeout=120).status_code == 200
        except httpx.HTTPError:
            ok = False
    return ok


def decode_steps(urls: Sequence[str]) -> Dict[str, Optional[int]]:
    """Each worker's decode steps so far (``GET /specopd/policy``: ``steps``; None if it does not answer)."""
    import httpx

    out: Dict[str, Optional[int]] = {}
    for u in urls:
        try:
            r = httpx.get(u + "/specopd/policy", timeout=30)
            out[u] = int(r.json()["steps"]) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            out[u] = None
    return out


def worker_urls(fleet) -> List[str]:
    return [w.url for w in fleet.workers]


def measure_level(fleet, prompts, concurrency: int, params, *, timeout_s: float,
                  admin_key: Optional[str]) -> Dict[str, Any]:
    """One level through the router, every worker's radix cache flushed first: its :func:`stats.level_entry`."""
    from dataclasses import asdict

    from sglang_specopd.app.bench.client import run_level
    from sglang_specopd.app.bench.metrics import summarize_level
    from specopd_trainer.intervals import acceptance_intervals

    flushed = flush_workers(worker_urls(fleet), admin_key)
    before = decode_steps(worker_urls(fleet))
    from fleetbench.cpu import cpu_seconds, cpu_split

    cpu0 = cpu_seconds(fleet)
    run = run_level(fleet.router_url, prompts, concurrency, params, timeout_s=timeout_s, api="generate")
    cpu1 = cpu_seconds(fleet)
    after = decode_steps(worker_urls(fleet))
    rows = [asdict(r) for r in run.records]
    summary = summarize_level(run.records, run.duration_s, speculative=True)
    per_request = [{"id": r["id"], "domain": r["domain"], "completion_tokens": r["completion_tokens"],
                    "verify_steps": r["verify_ct"]} for r in rows if r["ok"] and r["verify_ct"]]
    domains = sorted({r["domain"] for r in rows})
    try:
        tau = acceptance_intervals(per_request, domains)
    except ValueError:  # a domain without verify steps (a failed level): no tau
        tau = None
    steps = {u: (after[u] - before[u]) if after[u] is not None and before[u] is not None else None for u in after}
    return {**stats.level_entry(len(fleet.workers), concurrency, rows, run.duration_s, summary, tau, steps),
            "cache_flushed": flushed, "cpu": cpu_split(cpu0, cpu1, run.duration_s)}


def warm_up(fleet, prompts, params, *, timeout_s: float) -> None:
    """An unmeasured pass over ``prompts`` with two requests per worker in flight."""
    from sglang_specopd.app.bench.client import run_level

    if prompts:
        run_level(fleet.router_url, prompts, 2 * len(fleet.workers), params, timeout_s=timeout_s, api="generate")


# ------------------------------------------------------------------------------------------------ rollouts
class Rollouts:
    """One ``FleetRollout`` over a fleet's workers (each a timed worker), the updates it rolls out (the serving
    drafter's own weights under new version labels: the whole stage / commit path runs, acceptance stays the same)
    and the timing of each transaction."""

    def __init__(self, fleet, drafter_dir: str, admin_key: str, *, ttl_s: float, probe_ids: Sequence[int],
                 prefix: str = "bench", clock: Callable[[], float] = time.monotonic):
        from safetensors.torch import load_file

        from fleetbench.load import TimedWorker
        from specopd_trainer.fleet.rollout import FleetRollout
        from specopd_trainer.fleet.worker import DrafterUpdate

        self.clock, self.prefix, self.n = clock, prefix, 0
        self.events: List[Dict[str, Any]] = []
        self.lock = threading.Lock()
        self.config = json.loads((Path(drafter_dir) / "config.json").read_text())
        self.tensors = load_file(str(Path(drafter_dir) / "model.safetensors"))
        self.timed: Dict[str, TimedWorker] = {}

        def factory(url: str) -> TimedWorker:
            w = TimedWorker(url, events=self.events, lock=self.lock, clock=clock, admin_api_key=admin_key,
                            timeout=300.0, retries=2, backoff_s=0.5)
            self.timed[url.rstrip("/")] = w
            return w

        initial = DrafterUpdate.from_checkpoint(self.config, self.tensors, "initial")
        self.ro = FleetRollout(worker_urls(fleet), admin_api_key=admin_key, ttl_s=ttl_s,
                               probe_input_ids=list(probe_ids), initial=initial, worker_factory=factory)

    def update(self):
        from specopd_trainer.fleet.worker import DrafterUpdate

        self.n += 1
        return DrafterUpdate.from_checkpoint(self.config, self.tensors, f"{self.prefix}-v{self.n}")

    def rollout(self) -> Dict[str, Any]:
        """One transaction: its report's facts and :func:`stats.rollout_timing` (times on the load's clock)."""
        update = self.update()
        with self.lock:
            first = len(self.events)
        t0 = self.clock()
        report = self.ro.rollout(update)
        t1 = self.clock()
        with self.lock:
            evs = list(self.events[first:])
        timing = stats.rollout_timing(evs, t0, t1)
        return {"version": update.version, "txn": report.txn, "committed": report.committed, "ok": report.ok,
                "missed": list(report.missed), "refused": [list(x) for x in report.refused],
                "serving": {w.url: w.serving for w in report.workers}, "t_start": t0, "t_end": t1, **timing}

    def close(self) -> None:
        self.ro.close()


def _load_targets(fleet, concurrency: int, direct: int) -> list:
    return [("router", fleet.router_url, concurrency)] + [(f"direct:{u}", u, direct) for u in worker_urls(fleet)]


def _rel(x: Optional[float], t0: float) -> Optional[float]:
    return None if x is None else x - t0


def measure_rollouts(fleet, rollouts: Rollouts, prompt_ids, *, n: int, concurrency: int, direct: int,
                     max_new_tokens: int, settle_s: float, gap_s: float, say: Say) -> Dict[str, Any]:
    """``n`` rollouts, ``gap_s`` apart, under load; :func:`stats.rollout_summary`."""
    from fleetbench.load import VersionLoad

    served = {(w.info().reply or {}).get("version") for w in rollouts.timed.values()}
    # what the fleet serves before the first rollout: the rollouts' own last commit, or (the first time) whatever
    # the workers report, e.g. a trainer's push of part (d), not the start-up label
    initial = rollouts.ro.committed_version if rollouts.ro.committed_version != "initial" or len(served) != 1 \
        else served.pop()
    recs = []
    with VersionLoad(_load_targets(fleet, concurrency, direct), prompt_ids, max_new_tokens) as load:
        time.sleep(settle_s)
        for _ in range(n):
            rec = rollouts.rollout()
            recs.append(rec)
            say(f"  rollout {rec['version']}: {'committed' if rec['committed'] else 'aborted'}"
                f"{' + verified' if rec['ok'] else ''}; stage {rec['stage_s'] or 0:.2f} s, commit "
                f"{rec['commit_s'] or 0:.2f} s, verify {rec['verify_s'] or 0:.2f} s; {len(load.samples)} responses")
            time.sleep(gap_s)
        time.sleep(settle_s)
    t0 = load.t_start
    checks = stats.checks_by_target(load.samples, stats.with_base_commit(recs, initial, t0), initial)
    for r in recs:  # times relative to the load's start in the result
        for k in ("t_start", "t_end"):
            r[k] = _rel(r[k], t0)
        r["commit_window"] = [x - t0 for x in r["commit_window"]] if r["commit_window"] else None
    out = stats.rollout_summary(recs, checks, concurrency=concurrency)
    out.update(load_s=load.t_stop - t0, max_new_tokens=max_new_tokens, direct_samplers_per_worker=direct,
               initial_version=initial)
    return out


# ------------------------------------------------------------------------------------------------ kill -9
def kill_worker(server, clock: Callable[[], float] = time.monotonic) -> Dict[str, Any]:
    """SIGKILL the whole process group of ``server`` (an :class:`SGLangServer`), reap its leader; the time."""
    server.record_shm_refs()  # its /dev/shm files, removed by stop() later
    pid = server.proc.pid
    t = clock()
    os.killpg(pid, signal.SIGKILL)
    server.proc.wait(timeout=60)
    return {"t_kill": t, "pid": pid}


def restart_worker(fleet, index: int, *, timeout: float, log_dir: Path, tag: str) -> Dict[str, Any]:
    """Start worker ``index`` again on its port and cores (the killed one's files removed first)."""
    from sglang_specopd.app.launch.process import SGLangServer

    old = fleet.workers[index]
    old.stop(timeout=10)
    new = SGLangServer(old.spec, log_path=log_dir / f"worker-{index}.{tag}.log", cpu_cores=old.cpu_cores)
    fleet.workers[index] = new
    new.start(timeout)
    fleet.write()
    return {"time_to_healthy_s": new.time_to_healthy_s, "pid": new.proc.pid}


def kill_scenario(fleet, rollouts: Rollouts, prompt_ids, *, phase: str, concurrency: int, direct: int,
                  max_new_tokens: int, settle_s: float, after_kill_s: float, rejoin: bool, timeout: float,
                  log_dir: Path, say: Say) -> Dict[str, Any]:
    """A rollout during which the worker with the highest URL (not the lock worker: it is staged second) is killed
    with ``kill -9`` just before its ``phase`` (``stage`` | ``commit``) request; the router keeps serving the load;
    then, with ``rejoin``, the killed worker is restarted and reconciled. One ``faults`` item."""
    from fleetbench.load import VersionLoad

    urls = sorted(worker_urls(fleet))
    victim, survivor = urls[-1], urls[0]
    index = worker_urls(fleet).index(victim)
    killed: Dict[str, Any] = {}
    rollouts.timed[victim].before[phase] = lambda url: killed.update(kill_worker(fleet.workers[index],
                                                                                 rollouts.clock))
    initial = rollouts.ro.committed_version
    rejoin_info: Optional[Dict[str, Any]] = None
    with VersionLoad(_load_targets(fleet, concurrency, direct), prompt_ids, max_new_tokens) as load:
        time.sleep(settle_s)
        rec = rollouts.rollout()
        rollouts.timed[victim].before.pop(phase, None)
        survivor_info = rollouts.timed[survivor].info()
        say(f"  kill -9 worker {index} at its {phase}: {'committed' if rec['committed'] else 'aborted'}; survivor "
            f"serves {(survivor_info.reply or {}).get('version')}; missed {rec['missed']}")
        time.sleep(after_kill_s)
        if rejoin:
            t_r0 = rollouts.clock()
            started = restart_worker(fleet, index, timeout=timeout, log_dir=log_dir, tag=f"restart-{phase}")
            t_r1 = rollouts.clock()
            outcome = rollouts.ro.reconcile([victim])[0]
            t_r2 = rollouts.clock()
            rejoin_info = {"restart_s": t_r1 - t_r0, "reconcile_s": t_r2 - t_r1,
                           "reconciled": outcome.verify is not None and outcome.verify.ok, "serving": outcome.serving,
                           "error": outcome.error, "staged_again": outcome.stage is not None, **started,
                           "window": [t_r0, t_r2]}
            say(f"  worker {index} restarted in {rejoin_info['restart_s']:.0f} s, reconciled in "
                f"{rejoin_info['reconcile_s']:.2f} s: serves {outcome.serving}")
            time.sleep(settle_s)
    from sglang_specopd.app.fleet.router import router_readiness

    ready = router_readiness(fleet.router_url) or {}
    return stats.fault_entry(
        phase=phase, victim=victim, survivor=survivor, rollout=rec, t_kill=killed.get("t_kill"),
        survivor_serving=(survivor_info.reply or {}).get("version") if survivor_info.ok else None,
        initial=initial, samples=load.samples, rejoin=rejoin_info, t0=load.t_start, t_stop=load.t_stop,
        concurrency=concurrency, healthy_after=ready.get("healthy_workers"))
