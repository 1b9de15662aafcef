"""The soak's sessions: a pinned server, the trainer phase, the main soak (idle then training) and a curve point.

Everything that starts processes or threads lives here; the numbers are computed by :mod:`soak.stats`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from sglang_specopd.app.cpu_dtype import resolve_dtype

from .fuzz import Fuzzer
from .procs import (LoadStreams, RssSampler, greedy_probes, pin_session, start_trainer, stop_trainer,
                    trainer_command, trainer_metrics, wait_until)
from .proxy import CountingProxy, monotonic_clock
from .stats import (Tally, assemble_result, count_5xx, in_window, latency_summary, merge_errors, queue_wait_summary,
                    rss_growth_fraction)

DOMAINS = ["dialogue", "coding", "math", "agentic"]
ADMIN_KEY = "specopd-soak-admin"
MAX_PROMPT_TOKENS = 1024
BUDGET_LABEL = "score_trees_budget_tokens"


def say(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@contextmanager
def pinned_server(cfg, args, cores, log_path: Path):
    """A started server for ``cfg`` on ``cores[0]`` (this process back on ``cores[1]`` afterwards); stopped on exit."""
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.serve.spec import launch_spec

    server_cores, client_cores = cores
    os.environ["SPECOPD_CPU_SERVER_THREADS"] = str(len(server_cores) if server_cores else args.server_threads)
    server = SGLangServer(launch_spec(cfg, port=args.port, admin_api_key=ADMIN_KEY), log_path=log_path)
    if server_cores:
        os.sched_setaffinity(0, server_cores)  # inherited by the launcher and every process it forks
    try:
        server.start()
    finally:
        if client_cores:
            os.sched_setaffinity(0, client_cores)
    try:
        if server_cores:
            pin_session(server.proc.pid, server_cores)
        yield server
    finally:
        server.stop()


def drafter_info(url: str) -> dict:
    import httpx

    from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH

    return httpx.get(url + DRAFTER_INFO_PATH, timeout=60).json()


def prepare_data(url: str, tok, data_dir: Path, per_domain: int, max_new_tokens: int) -> None:
    """Target responses + context features for the trainer (the server's drafter's layers), cached in data_dir."""
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.pipeline import prepare_sequences

    layer_ids = drafter_info(url)["spec"]["target_layer_ids"]
    with SpecOPDClient(url) as client:
        prepare_sequences(client, tok, layer_ids, data_dir, domains=DOMAINS, per_domain=per_domain,
                          max_new_tokens=max_new_tokens)


def train_phase(args, proxy, clock, minutes: float, run_dir: Path, cores, tick) -> dict:
    """Run the trainer (via ``proxy``) for ``minutes`` of training; returns its exit code, end time and metrics."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = trainer_command(proxy.url, ADMIN_KEY, Path(args.run_dir) / "data", run_dir, minutes=minutes,
                          push_every=args.push_every, extra=shlex.split(args.trainer_args))
    threads = len(cores[1]) if cores[1] else args.server_threads
    proc = start_trainer(cmd, run_dir.parent / f"{run_dir.name}.log", threads)
    t0 = clock()
    wait_until(t0 + 60 * minutes + args.trainer_grace_s, clock, tick, stop=lambda: proc.poll() is not None)
    rc = stop_trainer(proc, 1.0)
    log = run_dir.parent / f"{run_dir.name}.log"
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.is_file() else "(no log)"
        say(f"trainer exited with code {rc}; last lines of {log}:\n{tail}")
    return {"exit_code": rc, "start_s": t0, "end_s": clock(), "first_score_s": proxy.first_score_s,
            "pushes": len(proxy.swap_times_s), "log": str(log), "command": " ".join(cmd), **trainer_metrics(run_dir)}


def idle_minutes(args) -> float:
    """The idle phase's minutes: ``--idle-minutes``, default min(4, minutes / 4)."""
    return args.idle_minutes if args.idle_minutes is not None else min(4.0, args.minutes / 4)


def load_setup(model_path: str, args):
    """(tokenizer, load prompts: ``--prompts-per-domain`` held-out prompts of each domain, probe prompts: the
    first of each domain, request params: ``--max-new-tokens`` at T=0 with EOS ignored)."""
    from transformers import AutoTokenizer

    from sglang_specopd.app.bench.client import RequestParams
    from sglang_specopd.app.bench.runner import load_prompts

    tok = AutoTokenizer.from_pretrained(model_path)
    prompts, _ = load_prompts(tok, DOMAINS, args.prompts_per_domain, max_prompt_tokens=MAX_PROMPT_TOKENS)
    probes = [next(p for p in prompts if p.domain == d) for d in DOMAINS if any(p.domain == d for p in prompts)]
    return tok, prompts, probes, RequestParams(args.max_new_tokens, 0.0, ignore_eos=True)


def ticker(phase: Callable[[], str], clock, tally: Tally, proxy: CountingProxy, load: LoadStreams,
           rss: Optional[RssSampler], run_dir: Callable[[], Path]) -> Callable[[], None]:
    """A progress line (phase, counters, swaps, RSS, trainer steps) for :func:`~soak.procs.wait_until`."""
    def tick() -> None:
        snap = tally.snapshot()
        last_rss = f"{rss.samples[-1][1]:.0f} MiB" if rss is not None and rss.samples else "-"
        steps = trainer_metrics(run_dir())["steps"]
        say(f"t={clock():.0f}s {phase()}: sent {snap['sent']}, load done {len(load.records)}, errors "
            f"{merge_errors(snap['errors']) or 'none'}, malformed {sum(snap['malformed'].values())}, swaps "
            f"{len(proxy.swap_times_s)}, trainer step {steps}, scheduler RSS {last_rss}")
    return tick


def run_soak(args, cfg, budget: int, cores) -> Dict[str, Any]:
    """The main soak: data prep, probes, idle phase, training phase, probes again; the result payload."""
    run_dir = Path(args.run_dir)
    tally, clock = Tally(), monotonic_clock(time.perf_counter())
    idle_min = idle_minutes(args)
    phase = ["idle"]
    with pinned_server(cfg, args, cores, run_dir / "server.log") as server:
        say(f"server up in {server.time_to_healthy_s:.0f} s ({cfg.name}, {BUDGET_LABEL}={budget}); trainer data")
        tok, prompts, probes, params = load_setup(server.spec.model_path, args)
        prepare_data(server.url, tok, run_dir / "data", args.per_domain, args.data_max_new_tokens)
        before = greedy_probes(server.url, probes, args.probe_tokens)
        info0 = drafter_info(server.url)
        with CountingProxy(server.url, lambda k, m: tally.add("trainer", k, m), clock) as proxy:
            rss = RssSampler(server.proc.pid, clock).start()
            fuzzer = Fuzzer(server.url, ADMIN_KEY, args.fuzz_rate, lambda k, m: tally.add("fuzzer", k, m),
                            clock=clock).start()
            load = LoadStreams(server.url, prompts, params, args.streams, clock,
                               lambda k, m: tally.add("load", k, m)).start()
            tick = ticker(lambda: phase[0], clock, tally, proxy, load, rss, lambda: run_dir / "train")
            say(f"load warm-up ({args.load_warmup_s:g} s, not measured), then the idle phase: {args.streams} "
                f"streams + fuzzer for {idle_min:g} min")
            t_idle0 = clock() + args.load_warmup_s  # the first requests after start-up are slower: not counted
            wait_until(t_idle0 + 60 * idle_min, clock, tick)
            t_idle1, phase[0] = clock(), "training"
            say(f"training phase: trainer for {args.minutes - idle_min:g} min of training")
            trainer = train_phase(args, proxy, clock, args.minutes - idle_min, run_dir / "train", cores, tick)
            say(f"trainer exited ({trainer['exit_code']}) after {trainer['steps']} steps; stopping the load")
            load.stop()
            fuzzer.stop()
            rss.stop()
            t_end = clock()
            affinity = sorted(os.sched_getaffinity(rss.pid)) if rss.pid else None
        after = greedy_probes(server.url, probes, args.probe_tokens)
        info1 = drafter_info(server.url)
    train0 = trainer["first_score_s"] if trainer["first_score_s"] is not None else trainer["end_s"]
    phases = {"idle": latency_summary(in_window(load.records, t_idle0, t_idle1)),
              "training": latency_summary(in_window(load.records, train0, trainer["end_s"]))}
    warmup = min(args.rss_warmup_s, (trainer["end_s"] - train0) / 3)
    waits = score_waits(proxy, fuzzer, train0, trainer["end_s"])
    extra = {
        **waits["all"], "score_queue_wait_by_source": {k: v for k, v in waits.items() if k != "all"},
        "score_queue_wait_limit_s": cfg.score_trees_queue_wait_s,
        "minutes_requested": args.minutes, "idle_minutes": idle_min, "rss_warmup_s": warmup,
        "load_warmup_s": args.load_warmup_s,
        "notes": ["every trainer start sends one empty swap body to check its admin key: one expected trainer 400",
                  "the fuzzer runs in both phases (idle and training), so the ITL ratio isolates the trainer"],
        "windows_s": {"idle": [t_idle0, t_idle1], "training": [train0, trainer["end_s"]]},
        "trainer": trainer, "trainer_pushes": trainer["pushes"],
        "drafter_version": {"before": info0.get("version"), "after": info1.get("version")},
        "fuzz_statuses_by_kind": fuzzer.statuses,
        "load": {"streams": args.streams, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                 "temperature": 0.0, "ignore_eos": True},
        "probes": {"ids": [p.id for p in probes], "max_new_tokens": args.probe_tokens, "before": before,
                   "after": after, "note": "fp32 server; compared with the trained drafter serving (lossless)"},
        "server": {"config": cfg.name, "dtype": resolve_dtype(cfg.device, cfg.dtype),
                   "log": str(run_dir / "server.log")},
        "pinning": {"server_cores": sorted(cores[0]) if cores[0] else None,
                    "client_cores": sorted(cores[1]) if cores[1] else None, "scheduler_affinity": affinity},
    }
    return assemble_result(
        minutes=(t_end - t_idle0) / 60, phases=phases, tally=tally.snapshot(), rss_mb=rss.samples,
        rss_growth=rss_growth_fraction(rss.samples, train0, trainer["end_s"], warmup),
        swaps=int(info1.get("swaps", 0)) - int(info0.get("swaps", 0)), probes_before=before, probes_after=after,
        scoring_budget=budget, extra=extra)


def score_waits(proxy: CountingProxy, fuzzer: Optional[Fuzzer], start_s: float, end_s: float) -> Dict[str, Any]:
    """Queue-wait summaries (:func:`~soak.stats.queue_wait_summary`) of the score_trees replies in the window:
    ``all``, ``trainer`` (through the proxy) and ``fuzzer`` (its small valid requests)."""
    trainer = list(proxy.score_waits)
    mine = list(fuzzer.score_waits) if fuzzer is not None else []
    return {"all": queue_wait_summary(trainer + mine, start_s, end_s),
            "trainer": queue_wait_summary(trainer, start_s, end_s),
            "fuzzer": queue_wait_summary(mine, start_s, end_s)}


def run_curve(args, cfg, budget: int, cores) -> Dict[str, Any]:
    """One trade-off point: a fresh server with ``budget``, load + trainer for ``--curve-minutes``; serving
    latency over the trainer's training window and the trainer's supervised tokens/s."""
    run_dir = Path(args.run_dir)
    tally, clock = Tally(), monotonic_clock(time.perf_counter())
    with pinned_server(cfg, args, cores, run_dir / f"server-curve-{budget}.log") as server:
        say(f"curve point {BUDGET_LABEL}={budget}: server up; {args.curve_minutes:g} min of training")
        _, prompts, _, params = load_setup(server.spec.model_path, args)
        with CountingProxy(server.url, lambda k, m: tally.add("trainer", k, m), clock) as proxy:
            load = LoadStreams(server.url, prompts, params, args.streams, clock,
                               lambda k, m: tally.add("load", k, m)).start()
            out_dir = run_dir / f"curve-{budget}"
            tick = ticker(lambda: f"curve {budget}", clock, tally, proxy, load, None, lambda: out_dir)
            trainer = train_phase(args, proxy, clock, args.curve_minutes, out_dir, cores, tick)
            load.stop()
    start = trainer["first_score_s"] if trainer["first_score_s"] is not None else trainer["end_s"]
    summary = latency_summary(in_window(load.records, start, trainer["end_s"]))
    errors = tally.snapshot()["errors"]
    return {"budget": budget, "minutes": args.curve_minutes, **summary,
            **score_waits(proxy, None, start, trainer["end_s"])["trainer"],
            "supervised_tokens_per_s": trainer["supervised_tokens_per_s"], "steps": trainer["steps"],
            "trainer_exit_code": trainer["exit_code"], "errors_by_source": errors,
            "errors_5xx": count_5xx(merge_errors(errors))}
