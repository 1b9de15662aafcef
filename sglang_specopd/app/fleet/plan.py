"""What ``specopd fleet start`` will run, decided before anything starts: ports, CPU cores, the router's command.

Pure functions (no process is started here), so every decision is unit-tested without servers:

* :func:`worker_ports`: worker ``i`` listens on ``base + i`` (default base: the router's port + 1);
* :func:`plan_cores`: with ``--pin-cores``, worker ``i`` gets its own slice of the cores this process may use
  (``os.sched_getaffinity``): equal contiguous slices when there are at least as many cores as workers, else core
  ``i mod ncores``;
* :func:`plan_gpus`: with ``--gpus-per-worker N``, worker ``i`` sees GPUs ``i*N .. i*N+N-1`` (its
  ``CUDA_VISIBLE_DEVICES``; of the supervisor's own ``CUDA_VISIBLE_DEVICES`` list when that is set);
  :func:`tp_args`: ``--tp-size`` for every worker, checked against those GPUs and the config's own flag;
* core lists and pinned commands: :mod:`sglang_specopd.app.launch.pinning` (a launch pins its own server too);
* :func:`router_argv`: the ``python -m sglang_router.launch_router`` command (the Rust load balancer of the
  ``sglang-router`` package; see ``docs/fleet.md``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence, Tuple

#: the routing policies ``sglang_router.launch_router --policy`` accepts (sglang-router 0.3.2)
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "manual")
DEFAULT_POLICY = "cache_aware"  # the router's own default


class FleetError(RuntimeError):
    """A fleet cannot be planned, started or stopped (one readable message)."""


def worker_ports(n_workers: int, router_port: int, base: Optional[int] = None) -> List[int]:
    """Ports of the ``n_workers`` workers: ``base, base + 1, ...`` (``base`` defaults to ``router_port + 1``).

    Raises:
        FleetError: fewer than one worker, a port outside 1..65535, or the router's port among the workers'.
    """
    if n_workers < 1:
        raise FleetError(f"--workers must be at least 1, got {n_workers}")
    base = router_port + 1 if base is None else base
    ports = [base + i for i in range(n_workers)]
    for p in [router_port, *ports]:
        if not 1 <= p <= 65535:
            raise FleetError(f"port {p} is outside 1..65535 (router --port {router_port}, --worker-base-port {base})")
    if router_port in ports:
        raise FleetError(f"the router's port {router_port} is also a worker's port ({ports[0]}..{ports[-1]}); "
                         "pick another --port or --worker-base-port")
    return ports


def plan_cores(n_workers: int, available: Sequence[int]) -> List[Tuple[int, ...]]:
    """The cores of each worker: ``available`` (sorted) cut into ``n_workers`` contiguous slices as equal as
    possible (the first ``len % n`` slices one core longer) when there are at least as many cores as workers;
    otherwise worker ``i`` gets core ``available[i mod ncores]`` alone (workers share cores).

    Raises:
        FleetError: no core available.
    """
    cores = sorted(set(int(c) for c in available))
    if not cores:
        raise FleetError("no CPU core available to pin the workers to")
    if n_workers < 1:
        raise FleetError(f"--workers must be at least 1, got {n_workers}")
    if len(cores) < n_workers:
        return [(cores[i % len(cores)],) for i in range(n_workers)]
    size, extra = divmod(len(cores), n_workers)
    out, start = [], 0
    for i in range(n_workers):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(cores[start:end]))
        start = end
    return out


def visible_gpus(environ: Optional[Mapping[str, str]] = None) -> Optional[List[str]]:
    """The supervisor's ``CUDA_VISIBLE_DEVICES`` as a list of ids, None when it is not set (every GPU visible)."""
    import os

    raw = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    return None if raw is None else [g.strip() for g in raw.split(",") if g.strip()]


def plan_gpus(n_workers: int, gpus_per_worker: Optional[int],
              visible: Optional[Sequence[str]] = None) -> List[Optional[str]]:
    """The ``CUDA_VISIBLE_DEVICES`` of each worker: worker ``i`` gets GPUs ``i*N .. i*N+N-1`` (N =
    ``gpus_per_worker``) of ``visible`` (the supervisor's list, :func:`visible_gpus`) or, without one, of the ids
    ``0, 1, ...``; None for every worker when ``gpus_per_worker`` is None (each inherits the supervisor's GPUs).

    Raises:
        FleetError: ``gpus_per_worker`` < 1, or fewer visible GPUs than ``n_workers * gpus_per_worker``.
    """
    if gpus_per_worker is None:
        return [None] * n_workers
    if gpus_per_worker < 1:
        raise FleetError(f"--gpus-per-worker must be at least 1, got {gpus_per_worker}")
    need = n_workers * gpus_per_worker
    ids = list(visible) if visible is not None else [str(i) for i in range(need)]
    if len(ids) < need:
        raise FleetError(f"--workers {n_workers} x --gpus-per-worker {gpus_per_worker} needs {need} GPUs; "
                         f"CUDA_VISIBLE_DEVICES lists {len(ids)} ({','.join(ids) or 'none'})")
    return [",".join(ids[i * gpus_per_worker:(i + 1) * gpus_per_worker]) for i in range(n_workers)]


def tp_args(tp_size: Optional[int], gpus_per_worker: Optional[int], worker_args: Sequence[str]) -> List[str]:
    """The SGLang flags ``--tp-size`` adds to every worker (``worker_args``: the config's ``extra_sglang_args`` and
    ``--sglang-arg`` flags, which may set it already).

    Raises:
        FleetError: ``tp_size`` < 1, another tensor-parallel size in ``worker_args``, or more ranks than the GPUs
            each worker gets.
    """
    given, args = 1, list(worker_args)  # as sglang_specopd.app.serve.dry_drafter.tp_size reads it
    for i, a in enumerate(args):
        key, eq, val = a.partition("=")
        if key in ("--tp-size", "--tp", "--tensor-parallel-size"):
            try:
                given = int(val if eq else args[i + 1])
            except (ValueError, IndexError):
                raise FleetError(f"{a} in {args} is not followed by an integer") from None
    tp = given if tp_size is None else tp_size
    if tp < 1:
        raise FleetError(f"--tp-size must be at least 1, got {tp}")
    if tp_size is not None and given not in (1, tp_size):
        raise FleetError(f"--tp-size {tp_size} conflicts with --tp-size {given} in the config's extra_sglang_args "
                         "or --sglang-arg")
    if gpus_per_worker is not None and tp > gpus_per_worker:
        raise FleetError(f"--tp-size {tp} needs {tp} GPUs per worker; --gpus-per-worker is {gpus_per_worker}")
    return ["--tp-size", str(tp)] if tp_size is not None and given != tp_size else []


def available_cores() -> List[int]:
    """The cores this process may run on (all the machine's where ``sched_getaffinity`` does not exist)."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class FleetOptions:
    """What ``specopd fleet start`` was asked for (its options, one to one)."""

    config: str
    workers: int
    run_dir: str = "runs/fleet"
    host: str = "127.0.0.1"
    port: int = 30000  # the router's
    worker_base_port: Optional[int] = None  # default: port + 1
    pin_cores: bool = False
    gpus_per_worker: Optional[int] = None  # CUDA_VISIBLE_DEVICES per worker (plan_gpus); None: --tp-size's or unset
    tp_size: Optional[int] = None  # every worker's --tp-size (tp_args)
    api_key: Optional[str] = field(default=None, repr=False)
    admin_api_key: Optional[str] = field(default=None, repr=False)
    drafter: Optional[str] = None
    policy: str = DEFAULT_POLICY
    sglang_args: Tuple[str, ...] = ()
    router_args: Tuple[str, ...] = ()
    timeout: float = 900.0  # seconds for the workers, then the router, to become healthy


@dataclass(frozen=True)
class RouterSpec:
    """The router in front of the workers: where it listens, which workers, how it routes."""

    worker_urls: Tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 30000
    prometheus_port: int = 29000
    policy: str = DEFAULT_POLICY
    api_key: Optional[str] = field(default=None, repr=False)  # the workers' --api-key: the router sends it to them and asks clients for it
    startup_timeout_s: int = 900
    log_level: str = "warn"
    extra_args: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def router_argv(spec: RouterSpec, python: Optional[str] = None) -> List[str]:
    """``python -m sglang_router.launch_router`` with the workers, host, port, policy and a Prometheus port of its
    own (the router's default, 29000, would collide between two fleets on one machine).

    Raises:
        FleetError: no worker or an unknown policy.
    """
    if not spec.worker_urls:
        raise FleetError("the router needs at least one worker URL")
    if spec.policy not in ROUTER_POLICIES:
        raise FleetError(f"unknown router policy {spec.policy!r}; one of {', '.join(ROUTER_POLICIES)}")
    argv = [python or sys.executable, "-m", "sglang_router.launch_router",
            "--worker-urls", *spec.worker_urls, "--host", spec.host, "--port", str(spec.port),
            "--policy", spec.policy, "--prometheus-host", spec.host, "--prometheus-port", str(spec.prometheus_port),
            "--worker-startup-timeout-secs", str(int(spec.startup_timeout_s)), "--log-level", spec.log_level]
    if spec.api_key:
        argv += ["--api-key", spec.api_key]
    return argv + list(spec.extra_args)
