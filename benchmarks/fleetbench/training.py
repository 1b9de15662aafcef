"""Part (d) of the fleet benchmark: ``specopd train specopd`` against the fleet (``--workers``, ``--router``), as a
user runs it, in a subprocess.

* :func:`train_run`: one run of ``--steps`` steps, pushes only at the end (``--push-every 0``: the push is not part
  of a step's time); supervised tokens/s from its ``metrics.jsonl`` (steps after the first);
* :func:`kill_during_training`: the same command with pushes every ``push_every`` steps; once step ``kill_at`` is in
  metrics.jsonl, ``kill -9`` of one worker (its process group) and, with ``rejoin``, its restart on its port and
  cores in a thread while the trainer goes on: which steps ran (none may be missing), the trainer's exit code, what
  each push did (committed, or deferred because a worker was down), and what each worker serves at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from fleetbench.phases import kill_worker, restart_worker, worker_urls

Say = Callable[[str], None]
RECIPE = ("--anchors", "8", "--branches", "7", "--root-anchors", "64", "--seqs-per-step", "2", "--lr", "1e-3",
          "--loss", "e2e_fkl_is")  # the README's validated setting


def train_command(fleet, admin_key: str, run_dir: Path, data: str, *, steps: int, push_every: int, per_domain: int,
                  max_new_tokens: int) -> List[str]:
    """The ``specopd train specopd`` command line against ``fleet`` (its workers and router)."""
    return [sys.executable, "-m", "sglang_specopd.app.cli", "train", "specopd", "--workers",
            ",".join(worker_urls(fleet)), "--router", fleet.router_url, "--admin-key", admin_key, "--data", data,
            "--per-domain", str(per_domain), "--max-new-tokens", str(max_new_tokens), "--run-dir", str(run_dir),
            "--steps", str(steps), "--push-every", str(push_every), "--ckpt-every", "4", "--no-progress", *RECIPE]


def read_metrics(run_dir: Path) -> List[Dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` ([] when absent)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_rates(rows: Sequence[Dict[str, Any]]) -> Dict[str, List[float]]:
    """Per step after the first: supervised tokens and training seconds (differences of the cumulative
    ``supervised_tokens`` / ``supervised_wall_s`` columns), keyed by step."""
    rows = sorted(rows, key=lambda r: r["step"])
    steps, tokens, secs = [], [], []
    for a, b in zip(rows, rows[1:]):
        steps.append(int(b["step"]))
        tokens.append(float(b["supervised_tokens"] - a["supervised_tokens"]))
        secs.append(float(b["supervised_wall_s"] - a["supervised_wall_s"]))
    return {"steps": steps, "tokens": tokens, "seconds": secs}


def rate_interval(tokens: Sequence[float], seconds: Sequence[float], *, n_boot: int = 2000, seed: int = 0):
    """sum(tokens) / sum(seconds) with a bootstrap 95% interval over steps; (None, None) without steps."""
    t, s = np.asarray(tokens, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if not len(t) or s.sum() <= 0:
        return None, None
    idx = np.random.default_rng(seed).integers(0, len(t), size=(n_boot, len(t)))
    boot = t[idx].sum(axis=1) / s[idx].sum(axis=1)
    return float(t.sum() / s.sum()), [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def paired_step_ratio(a: Dict[str, List[float]], b: Dict[str, List[float]], *, n_boot: int = 2000, seed: int = 0):
    """Supervised tokens/s of run ``a`` over run ``b`` on the steps both ran (the same seed: the same sequences,
    anchors and branches per step), with a bootstrap 95% interval resampling those steps in both."""
    common = sorted(set(a["steps"]) & set(b["steps"]))
    if not common:
        return None, None
    ia, ib = [a["steps"].index(k) for k in common], [b["steps"].index(k) for k in common]
    ta, sa = np.asarray(a["tokens"])[ia], np.asarray(a["seconds"])[ia]
    tb, sb = np.asarray(b["tokens"])[ib], np.asarray(b["seconds"])[ib]
    idx = np.random.default_rng(seed).integers(0, len(common), size=(n_boot, len(common)))
    boot = (ta[idx].sum(1) / sa[idx].sum(1)) / (tb[idx].sum(1) / sb[idx].sum(1))
    point = (ta.sum() / sa.sum()) / (tb.sum() / sb.sum())
    return float(point), [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def _start(cmd: List[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)


def train_run(fleet, admin_key: str, run_dir: Path, data: str, *, steps: int, per_domain: int, max_new_tokens: int,
              timeout_s: float, say: Say) -> Dict[str, Any]:
    """One fresh training run (``run_dir`` emptied first) of ``steps`` steps; its supervised tokens/s."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = train_command(fleet, admin_key, run_dir, data, steps=steps, push_every=0, per_domain=per_domain,
                        max_new_tokens=max_new_tokens)
    t0 = time.monotonic()
    proc = _start(cmd, run_dir.with_name(run_dir.name + ".log"))
    rc = proc.wait(timeout=timeout_s)
    rows = read_metrics(run_dir)
    rates = step_rates(rows)
    rate, ci = rate_interval(rates["tokens"], rates["seconds"])
    out = {"workers": len(fleet.workers), "exit_code": rc, "steps_logged": len(rows), "wall_s": time.monotonic() - t0,
           "supervised_tokens": rows[-1]["supervised_tokens"] if rows else None,
           "supervised_tokens_per_s": rate, "supervised_tokens_per_s_ci95": ci, "per_step": rates,
           "command": " ".join(["specopd", *cmd[3:]]).replace(admin_key, "$ADMIN_KEY")}
    say(f"  training on {len(fleet.workers)} worker(s): exit {rc}, {len(rows)} steps, "
        f"{rate or float('nan'):.1f} supervised tokens/s")
    return out


def _served(urls: Sequence[str]) -> Dict[str, Optional[str]]:
    import httpx

    out: Dict[str, Optional[str]] = {}
    for u in urls:
        try:
            out[u] = httpx.get(u + "/specopd/drafter", timeout=30).json().get("version")
        except (httpx.HTTPError, ValueError):
            out[u] = None
    return out


def kill_during_training(fleet, admin_key: str, run_dir: Path, data: str, *, steps: int, push_every: int,
                         kill_at: int, per_domain: int, max_new_tokens: int, rejoin: bool, timeout_s: float,
                         start_timeout: float, log_dir: Path, say: Say) -> Dict[str, Any]:
    """``kill -9`` of the worker with the highest URL once step ``kill_at`` is logged (the trainer pushes every
    ``push_every`` steps); with ``rejoin`` it is restarted at once in a thread. One ``faults`` item."""
    shutil.rmtree(run_dir, ignore_errors=True)
    urls = sorted(worker_urls(fleet))
    victim = urls[-1]
    index = worker_urls(fleet).index(victim)
    cmd = train_command(fleet, admin_key, run_dir, data, steps=steps, push_every=push_every, per_domain=per_domain,
                        max_new_tokens=max_new_tokens)
    log = run_dir.with_name(run_dir.name + ".log")
    t0 = time.monotonic()
    proc = _start(cmd, log)
    killed: Dict[str, Any] = {}
    restart: Dict[str, Any] = {}
    thread: Optional[threading.Thread] = None
    while proc.poll() is None and time.monotonic() - t0 < timeout_s:
        if not killed and any(r["step"] >= kill_at for r in read_metrics(run_dir)):
            killed = kill_worker(fleet.workers[index])
            killed["t_kill"] -= t0
            say(f"  kill -9 worker {index} ({victim}) after training step {kill_at}")
            if rejoin:
                def again():
                    t = time.monotonic()
                    try:
                        restart.update(restart_worker(fleet, index, timeout=start_timeout, log_dir=log_dir,
                                                      tag="restart-training"))
                    except Exception as exc:  # recorded, the trainer goes on regardless
                        restart["error"] = f"{type(exc).__name__}: {exc}"
                    restart["t_ready"] = time.monotonic() - t0
                    restart["restart_s"] = time.monotonic() - t
                thread = threading.Thread(target=again, daemon=True)
                thread.start()
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    rc = proc.wait()
    if thread is not None:
        thread.join(start_timeout)
    rows = read_metrics(run_dir)
    logged = sorted({int(r["step"]) for r in rows})
    text = log.read_text(errors="replace") if log.is_file() else ""
    deferred = [line.strip() for line in text.splitlines() if "deferred" in line]
    served = _served(worker_urls(fleet))
    final = f"specopd-{run_dir.name}-step{steps}"
    lost = sorted(set(range(1, steps + 1)) - set(logged))
    entry = {"what": "kill -9 worker during training", "victim": victim, "kill_after_step": kill_at,
             "t_kill_s": killed.get("t_kill"), "trainer_exit_code": rc, "steps": steps, "steps_logged": len(logged),
             "lost_steps": lost, "push_every": push_every, "deferred_push_lines": deferred[:10],
             "rejoin": restart or None, "serving_at_end": served, "final_version": final,
             "all_on_final_version": all(v == final for v in served.values()),
             "wall_s": time.monotonic() - t0,
             "command": " ".join(["specopd", *cmd[3:]]).replace(admin_key, "$ADMIN_KEY")}
    entry["outcome"] = (f"trainer exit {rc}; {len(logged)}/{steps} steps logged (lost {lost or 'none'}); "
                        f"{len(deferred)} push line(s) deferred while the worker was down; at the end every worker "
                        f"serves {final}: {entry['all_on_final_version']}")
    say(f"  {entry['outcome']}")
    return entry


def fleet_run(fl, args, admin: str, state: Dict[str, Any], domains: Sequence[str], say: Say) -> Dict[str, Any]:
    """Part (d) on one fleet: a training run; the first one prepares the data every later run reads."""
    n = len(fl.workers)
    run_dir = args.run_dir / f"train-w{n}"
    out = train_run(fl, admin, run_dir, state["train_data"] or ",".join(domains), steps=args.train_steps,
                    per_domain=args.train_per_domain, max_new_tokens=args.train_max_new_tokens,
                    timeout_s=args.train_timeout, say=say)
    if state["train_data"] is None and (run_dir / "data" / "responses.jsonl").is_file():
        data = args.run_dir / "train-data"
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(run_dir / "data", data)
        state["train_data"] = str(data)
    return out


def summary(runs: Dict[str, Any]) -> Dict[str, Any]:
    """Part (d): each fleet's run and the paired ratio of every larger fleet over the smallest."""
    if not runs:
        return {"status": "not run", "workers": {}}
    base = min(runs, key=int)
    ratios = {}
    for n, run in runs.items():
        if n != base:
            point, ci = paired_step_ratio(run["per_step"], runs[base]["per_step"])
            ratios[f"{n}_vs_{base}"] = {"supervised_tokens_per_s_ratio": point, "ci95": ci}
    return {"status": "measured", "workers": runs, "ratios": ratios}
