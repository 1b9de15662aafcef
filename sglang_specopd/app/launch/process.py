"""Start, health-check and stop a real SGLang server with the sglang-specopd plugin loaded.

The server is ``python -m sglang.launch_server`` in its own process group (so it and all its children are
killed together: no orphan schedulers). On ``device="cpu"`` the environment selects SGLang's CPU engine
(``SGLANG_USE_CPU_ENGINE=1``) and puts the ``sgl_kernel`` stand-in first on ``PYTHONPATH``; nothing of that is
set on GPU. Each server gets a private ``TMPDIR`` (SGLang's ZeroMQ ipc sockets land there) that is removed on stop,
together with the ``/dev/shm`` semaphores its processes left (:mod:`sglang_specopd.app.launch.cleanup`).
Used by ``specopd serve``, the tests' fixtures, the benchmarks and the main job.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from sglang_specopd.app.launch.cleanup import (make_private_tmpdir, remove_shm_files, remove_tree,
                                               shm_refs_of_session, stop_process_group)


class ServeError(RuntimeError):
    """The server could not be started (bad input caught before launch, or SGLang failed to come up)."""


class PortInUseError(ServeError):
    """The requested host:port is already bound by another process."""


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`PortInUseError` if ``host:port`` cannot be bound right now, :class:`ServeError` if ``port``
    is not a usable TCP port (1..65535; 0 would let SGLang bind a random port nobody knows)."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServeError(f"--port must be in 1..65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like uvicorn: SO_REUSEADDR, so sockets in TIME_WAIT do not count, a live listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise PortInUseError(f"port {port} on {host} is already in use; pick another with --port") from None


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral TCP port that is free at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_env(device: str, base: Optional[Dict[str, str]] = None, prefix_cache_mb: int = 0,
               score=None, traffic_spool_mb: float = 0, traffic_features_mb: float = 0) -> Dict[str, str]:
    """Environment for the SGLang process, as the plugin asks for it
    (:func:`sglang_specopd.server.plugin.launch_environment`; ``score``: a
    :class:`sglang_specopd.server.scoring.cost.ScoreSettings`, None for the defaults; ``traffic_spool_mb``: the
    live-traffic spool, ``traffic_features_mb``: features captured while serving, 0 = off)."""
    from sglang_specopd.server.plugin import launch_environment

    return launch_environment(device, base, prefix_cache_mb, score, traffic_spool_mb, traffic_features_mb)


@dataclass
class LaunchSpec:
    """Everything needed to run one SGLang server process."""

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    device: str = "cuda"
    dtype: str = "auto"
    drafter_path: Optional[str] = None
    speculative_algorithm: Optional[str] = None
    block_size: Optional[int] = None
    attention_backend: Optional[str] = None
    max_total_tokens: Optional[int] = None
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    disable_cuda_graph: bool = False
    disable_overlap_schedule: bool = False
    sleep_on_idle: bool = False
    api_key: Optional[str] = None
    admin_api_key: Optional[str] = None
    prefix_cache_mb: int = 0
    score_budget_tokens: int = 0  # score_trees_* server-config keys (sglang_specopd.server.scoring.cost.ScoreSettings)
    score_queue_max: int = 4
    score_max_request_mb: int = 1024
    score_queue_wait_s: float = 10.0
    traffic_spool_mb: float = 0  # live-traffic spool (sglang_specopd.server.traffic.spool); 0 = off
    traffic_features_mb: float = 0  # context features captured while serving (server.traffic_features); 0 = off
    speculative_policy: str = "fixed"  # drafts verified per step: fixed (the block) | goodput (wire/policy.py)
    served_model_name: Optional[str] = None  # the model id the OpenAI API reports (default: SGLang's, the path)
    drafter_max_payload_mb: Optional[float] = None  # drafter push limit (server.drafter_upload); None: payload limit
    cuda_visible_devices: Optional[str] = None  # the server's GPUs (specopd fleet start --gpus-per-worker); None: as is
    extra_args: List[str] = field(default_factory=list)

    def score_settings(self):
        """The score_trees budget, queue, cost cap and queue wait as
        :class:`sglang_specopd.server.scoring.cost.ScoreSettings`."""
        from sglang_specopd.server.scoring.cost import ScoreSettings

        return ScoreSettings(self.score_budget_tokens, self.score_queue_max, self.score_max_request_mb,
                             self.score_queue_wait_s)

    def argv(self) -> List[str]:
        """The ``python -m sglang.launch_server ...`` command line."""
        a = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_path,
             "--host", self.host, "--port", str(self.port), "--device", self.device, "--dtype", self.dtype]
        if self.served_model_name:
            a += ["--served-model-name", self.served_model_name]
        if self.drafter_path and self.speculative_algorithm:
            a += ["--speculative-algorithm", self.speculative_algorithm,
                  "--speculative-draft-model-path", self.drafter_path]
            if self.block_size and self.speculative_algorithm.upper() in ("DSPARK", "SPECOPD_DSPARK"):
                # DSPARK's block flag is gamma, the drafted tokens per block (the verify block B = gamma + 1);
                # SPECOPD_DSPARK resolves its arguments as DSPARK (sglang_specopd.server.algorithm.dspark)
                a += ["--speculative-dspark-block-size", str(self.block_size - 1)]
            elif self.block_size:
                a += ["--speculative-dflash-block-size", str(self.block_size)]
            if self.device == "cpu":
                a += ["--speculative-draft-attention-backend", "torch_native"]
        for flag, val in (("--attention-backend", self.attention_backend),
                          ("--max-total-tokens", self.max_total_tokens),
                          ("--mem-fraction-static", self.mem_fraction_static),
                          ("--max-running-requests", self.max_running_requests),
                          ("--api-key", self.api_key), ("--admin-api-key", self.admin_api_key)):
            if val is not None:
                a += [flag, str(val)]
        for flag, on in (("--disable-cuda-graph", self.disable_cuda_graph),
                         ("--disable-overlap-schedule", self.disable_overlap_schedule),
                         ("--sleep-on-idle", self.sleep_on_idle)):
            if on:
                a.append(flag)
        return a + list(self.extra_args)


_LIVE: "set[SGLangServer]" = set()


def _stop_all_live() -> None:
    for server in list(_LIVE):
        server.stop()


def _install_cleanup() -> None:
    """Stop every server this process started when it exits, including on SIGTERM (no orphan schedulers)."""
    import atexit
    import threading

    if getattr(_install_cleanup, "done", False):
        return
    _install_cleanup.done = True
    atexit.register(_stop_all_live)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def on_term(signum, frame):
            _stop_all_live()
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)


class SGLangServer:
    """A running SGLang server; a context manager that always tears the whole process group down.

    Servers still running when the process exits (normally, by an exception, or by SIGTERM when no other SIGTERM
    handler is installed) are stopped too.
    """

    def __init__(self, spec: LaunchSpec, log_path: Optional[str | Path] = None,
                 cpu_cores: Optional[List[int]] = None):
        self.spec = spec
        #: CPU cores the server's processes are pinned to (``specopd fleet start --pin-cores``); None: not pinned
        self.cpu_cores = sorted(set(cpu_cores)) if cpu_cores else None
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="sglang-", suffix=".log")[1])
        self.proc: Optional[subprocess.Popen] = None
        self.time_to_healthy_s: Optional[float] = None
        #: the server's private TMPDIR while it runs (None before start and after stop)
        self.tmpdir: Optional[str] = None
        #: (device, inode) of the /dev/shm files seen in the server's processes; unlinked on stop if still there
        self.shm_refs: "set[tuple[int, int]]" = set()

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    def start(self, timeout: float = 600.0) -> "SGLangServer":
        """Launch and block until ``/health_generate`` answers 200; raise :class:`ServeError` on failure."""
        check_port_free(self.spec.host, self.spec.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        t0 = time.monotonic()
        env = server_env(self.spec.device, prefix_cache_mb=self.spec.prefix_cache_mb, score=self.spec.score_settings(),
                         traffic_spool_mb=self.spec.traffic_spool_mb,
                         traffic_features_mb=self.spec.traffic_features_mb)
        from sglang_specopd.wire.policy import policy_env

        env.update(policy_env(self.spec.speculative_policy))
        from sglang_specopd.server.drafter.upload import limit_env

        env.update(limit_env(self.spec.drafter_max_payload_mb))
        if self.spec.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.spec.cuda_visible_devices
        self.tmpdir = make_private_tmpdir(env)
        argv = self.spec.argv()
        if self.cpu_cores:
            from sglang_specopd.app.launch.pinning import cpu_list, pinned_argv

            argv = pinned_argv(argv, self.cpu_cores)
            if self.spec.device == "cpu":  # SGLang's CPU engine binds its OpenMP threads itself (AMX / arm64 builds)
                env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_list(self.cpu_cores)
        try:
            self.proc = subprocess.Popen(argv, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            remove_tree(self.tmpdir)
            self.tmpdir = None
            raise
        finally:
            log.close()
        _install_cleanup()
        _LIVE.add(self)
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        self.time_to_healthy_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        headers = {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}
        next_scan = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_scan:  # a start-up death leaves no process to look at in stop()
                self.record_shm_refs()
                next_scan = time.monotonic() + 5.0
            if self.proc.poll() is not None:
                raise ServeError(f"SGLang exited with code {self.proc.returncode} during start-up; "
                                 f"last log lines ({self.log_path}):\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/health_generate", headers=headers, timeout=30)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise ServeError(f"SGLang did not become healthy within {timeout:.0f} s; log: {self.log_path}\n{self.log_tail()}")

    def log_tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def record_shm_refs(self) -> "set[tuple[int, int]]":
        """Add the ``/dev/shm`` files the server's live processes map or hold open to :attr:`shm_refs`."""
        if self.proc is not None:
            self.shm_refs |= shm_refs_of_session(self.proc.pid)
        return self.shm_refs

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``timeout`` seconds (idempotent).

        Then remove what the server left behind: its private TMPDIR (ipc sockets) and the ``/dev/shm`` entries
        (``sem.mp-*`` semaphores, load snapshots) its processes had that are still there.
        """
        if self.proc is None:
            return
        self.record_shm_refs()
        stop_process_group(self.proc, timeout)
        self.proc = None
        _LIVE.discard(self)
        remove_shm_files(self.shm_refs)
        self.shm_refs = set()
        remove_tree(self.tmpdir)
        self.tmpdir = None

    def __enter__(self) -> "SGLangServer":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
