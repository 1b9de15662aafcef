"""The moving parts of a soak: load streams, scheduler RSS sampling, CPU pinning, the trainer subprocess.

CPU pinning: the server must run on its own core(s) and everything else (load streams, fuzzer, proxy, trainer)
on the others, so that the latency ratio measures the scheduler sharing its time between serving and scoring,
not two processes fighting over the same core. Affinity is inherited at fork, so the soak process pins itself to
the server's cores while it launches the server, then to the client cores; :func:`pin_session` then also pins
every thread of every process of the server's session, in case one was started from another thread.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from sglang_specopd.app.bench.client import BenchPrompt, RequestParams, run_level

from .stats import TimedRecord, load_outcome
from .worker import Background

RSS_PERIOD_S = 5.0


def parse_cores(text: str) -> Set[int]:
    """``"0"`` / ``"1,2"`` / ``"2-3"`` -> a set of CPU ids; raises ValueError for an empty or malformed list."""
    cores: Set[int] = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        cores |= set(range(int(lo), int(hi or lo) + 1))
    if not cores:
        raise ValueError(f"no CPU ids in {text!r}")
    return cores


def pin_session(sid: int, cores: Set[int]) -> int:
    """Pin every thread of every process of session ``sid`` to ``cores``; the number of threads pinned."""
    from sglang_specopd.app.launch.cleanup import session_pids

    n = 0
    for pid in session_pids(sid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
                n += 1
            except OSError:
                pass
    return n


def scheduler_pid(launcher_pid: int) -> Optional[int]:
    """The SGLang scheduler among the launcher's descendants (process title ``sglang::scheduler...``, truncated
    to ``sglang::schedul`` in the kernel's name); else the descendant with the largest RSS; None if none."""
    import psutil

    try:
        kids = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return None
    best, best_rss = None, -1
    for p in kids:
        try:
            title = p.name() + " " + " ".join(p.cmdline())
            if "sglang::sched" in title:
                return p.pid
            rss = p.memory_info().rss
        except psutil.Error:
            continue
        if rss > best_rss:
            best, best_rss = p.pid, rss
    return best


class RssSampler(Background):
    """Samples the scheduler's RSS (MiB) every ``period_s`` on a thread: :attr:`samples` = [[t_s, mb], ...]."""

    def __init__(self, launcher_pid: int, clock: Callable[[], float], period_s: float = RSS_PERIOD_S):
        self.launcher_pid, self.clock, self.period_s = launcher_pid, clock, period_s
        self.samples: List[List[float]] = []
        self.pid: Optional[int] = None
        super().__init__("soak-rss")

    def _run(self) -> None:
        import psutil

        while True:
            try:
                if self.pid is None:
                    self.pid = scheduler_pid(self.launcher_pid)
                if self.pid is not None:
                    self.samples.append([self.clock(), psutil.Process(self.pid).memory_info().rss / 2**20])
            except psutil.Error:
                self.pid = None
            if self._stop.wait(self.period_s):
                return


class LoadStreams:
    """``streams`` threads, each sending the prompts (cycled, shared) one at a time through the bench client's
    :func:`run_level` until stopped; :attr:`records` = [(send time on the soak clock, RequestRecord)].

    ``record(error_key_or_None, malformed)`` is called per finished request.
    """

    def __init__(self, url: str, prompts: Sequence[BenchPrompt], params: RequestParams, streams: int,
                 clock: Callable[[], float], record: Callable[[Optional[str], bool], None],
                 timeout_s: float = 300.0):
        if streams < 1 or not prompts:
            raise ValueError(f"need >= 1 stream and >= 1 prompt, got {streams} and {len(prompts)}")
        self.url, self.params, self.clock, self.record, self.timeout_s = url, params, clock, record, timeout_s
        self.records: List[TimedRecord] = []
        self._next = itertools.cycle(prompts)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"soak-load-{i}", daemon=True)
                         for i in range(streams)]

    def start(self) -> "LoadStreams":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stop sending; wait for the requests in flight (at most the request timeout)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s + 10)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                prompt = next(self._next)
            sent = self.clock()
            rec = run_level(self.url, [prompt], 1, self.params, timeout_s=self.timeout_s).records[0]
            with self._lock:
                self.records.append((sent, rec))
            self.record(*load_outcome(rec))


def greedy_probes(url: str, prompts: Sequence[BenchPrompt], max_new_tokens: int) -> List[List[int]]:
    """Greedy (T=0) output ids of each prompt, one request at a time (no other traffic should run)."""
    from specopd_trainer.client.http import SpecOPDClient

    with SpecOPDClient(url) as client:
        return [list(client.generate(list(p.prompt_ids), max_new_tokens=max_new_tokens, temperature=0.0)
                     ["output_ids"]) for p in prompts]


def trainer_command(server_url: str, admin_key: str, data_dir: Path, run_dir: Path, *, minutes: float,
                    push_every: int, extra: Sequence[str] = ()) -> List[str]:
    """``specopd train specopd`` against ``server_url`` for ``minutes`` of training (steps unbounded), starting
    from the server's own drafter, on the prepared data in ``data_dir``, pushing every ``push_every`` steps."""
    return [sys.executable, "-m", "sglang_specopd.app.cli", "train", "specopd", "--server", server_url,
            "--admin-key", admin_key, "--data", str(data_dir), "--run-dir", str(run_dir),
            "--steps", "1000000", "--max-minutes", f"{minutes:g}", "--push-every", str(push_every),
            "--ckpt-every", "1000000", "--no-progress", *extra]


def start_trainer(cmd: Sequence[str], log_path: Path, threads: int) -> subprocess.Popen:
    """Start the trainer in its own session (output to ``log_path``, overwritten; ``threads`` torch threads)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)


def stop_trainer(proc: subprocess.Popen, wait_s: float) -> int:
    """Wait ``wait_s`` for the trainer to exit by itself, then SIGTERM (and SIGKILL) its session; its exit code."""
    for sig, wait in ((None, wait_s), (signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if sig is not None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def trainer_metrics(run_dir: Path) -> Dict[str, Any]:
    """Steps, supervised tokens and supervised tokens/s (tokens over the trainer's training wall time) from the
    last row of ``run_dir/metrics.jsonl``; zeros when there is none."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not rows:
        return {"steps": 0, "supervised_tokens": 0, "supervised_tokens_per_s": 0.0}
    last = rows[-1]
    return {"steps": int(last.get("step", len(rows))), "supervised_tokens": int(last.get("supervised_tokens", 0)),
            "supervised_tokens_per_s": float(last.get("supervised_tokens_per_s", 0.0)),
            "supervised_wall_s": float(last.get("supervised_wall_s", 0.0))}


def wait_until(deadline_s: float, clock: Callable[[], float], tick: Callable[[], None], every_s: float = 30.0,
               stop: Optional[Callable[[], bool]] = None) -> None:
    """Sleep until ``clock() >= deadline_s`` (or ``stop()`` is true), calling ``tick()`` every ``every_s``."""
    next_tick = clock() + every_s
    while clock() < deadline_s and not (stop and stop()):
        time.sleep(min(1.0, max(0.0, deadline_s - clock())))
        if clock() >= next_tick:
            tick()
            next_tick += every_s
