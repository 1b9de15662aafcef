"""The live-traffic session: one SPECOPD server recording its traffic, the load, and ``specopd train draft-opd
--from-traffic`` beside them; the optional held-out evaluation of the initial and final drafter.

The server, its pinning, the trainer subprocess, the counting proxy (trainer statuses and push times) and the
progress ticks are the live-training soak's (``benchmarks/soak``); the numbers are computed by
:mod:`live_traffic.stats`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

from sglang_specopd.app.cpu_dtype import resolve_dtype

from soak.procs import start_trainer, stop_trainer, wait_until
from soak.proxy import CountingProxy, monotonic_clock
from soak.session import ADMIN_KEY, drafter_info, pinned_server
from soak.stats import Tally

from .load import DOMAINS, TrafficGenerator, train_prompts
from .stats import assemble_result, heldout_comparison, pooled_tau, trainer_summary


def say(text: str) -> None:
    print(f"[live-traffic {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def trainer_minutes(args) -> float:
    """The trainer's ``--max-minutes``: from the end of the warm-up to the end of the run, less its start-up
    allowance (so that it ends by itself, with its final push, while the traffic still flows)."""
    return args.minutes - args.warmup_minutes - args.trainer_startup_minutes


def draft_opd_command(server_url: str, admin_key: str, run_dir: Path, *, minutes: float, push_every: int,
                      traffic_items: int, max_blocks: int, lr: float, traffic_wait_s: float,
                      extra: Sequence[str] = ()) -> List[str]:
    """``specopd train draft-opd --from-traffic`` against ``server_url`` for ``minutes`` of training (steps
    unbounded), starting from the server's drafter, pushing every ``push_every`` steps. The prompt data is unused
    with ``--from-traffic`` (one dialogue prompt keeps its loading cheap). ``extra`` comes last (later options
    win)."""
    return [sys.executable, "-m", "sglang_specopd.app.cli", "train", "draft-opd", "--server", server_url,
            "--admin-key", admin_key, "--from-traffic", "--run-dir", str(run_dir), "--data", "dialogue",
            "--per-domain", "1", "--steps", "1000000", "--max-minutes", f"{minutes:g}",
            "--push-every", str(push_every), "--traffic-items", str(traffic_items), "--max-blocks", str(max_blocks),
            "--traffic-wait-s", f"{traffic_wait_s:g}", "--lr", f"{lr:g}", "--ckpt-every", "25", "--no-progress",
            *extra]


def heldout_eval(url: str, tokenizer, args) -> Dict[str, Any]:
    """:func:`specopd_trainer.evaluate.evaluate_acceptance` on the first ``--eval-limit`` held-out prompts per
    domain, T=0, ``--max-new-tokens``, ``--concurrency`` in flight (nothing else running)."""
    from specopd_trainer.evaluate import evaluate_acceptance

    return evaluate_acceptance(url, tokenizer, DOMAINS, temperature=0.0, limit=args.eval_limit,
                               max_new_tokens=args.max_new_tokens, concurrency=args.concurrency, progress=False)


def _log_tail(path: Path, n: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.is_file() else "(no log)"


def ticker(status: Dict[str, str], rel, load: TrafficGenerator, proxy: CountingProxy, train_dir: Path,
           window_s: float):
    """A progress line (phase, served, errors, tau of the last window, pushes, trainer step) for ``wait_until``."""
    def tick() -> None:
        recs = load.snapshot()
        last = pooled_tau([r for r in recs if r.done_s >= rel() - window_s])["tau"]
        say(f"t={rel():.0f}s {status['phase']}: served {sum(r.ok for r in recs)}, errors "
            f"{sum(not r.ok for r in recs)}, tau (last {window_s:g} s) {'-' if last is None else f'{last:.3f}'}, "
            f"pushes {len(proxy.swap_times_s)}, trainer step {trainer_summary(train_dir)['steps']}")
    return tick


def run_live(args, cfg, cores) -> Dict[str, Any]:
    """The whole run (see the script's docstring); returns the result payload."""
    from transformers import AutoTokenizer

    from specopd_trainer.client.http import SpecOPDClient

    run_dir = Path(args.run_dir)
    train_dir = run_dir / "train"
    shutil.rmtree(train_dir, ignore_errors=True)  # an old run dir would make the trainer resume
    tally = Tally()
    with pinned_server(cfg, args, cores, run_dir / "server.log") as server:
        say(f"server up in {server.time_to_healthy_s:.0f} s ({cfg.name}, drafter {cfg.drafter}, "
            f"traffic spool {cfg.traffic_spool_mb:g} MiB)")
        tok = AutoTokenizer.from_pretrained(server.spec.model_path)
        prompts, skipped = train_prompts(tok, DOMAINS, max_prompt_tokens=args.max_prompt_tokens, seed=args.seed)
        info0 = drafter_info(server.url)
        admin = SpecOPDClient(server.url, admin_api_key=ADMIN_KEY, retries=2)
        eval0 = None
        if args.eval_limit:
            say(f"held-out evaluation of the initial drafter ({args.eval_limit} prompts per domain)")
            eval0 = heldout_eval(server.url, tok, args)
        purged = admin.purge_traffic()  # the held-out requests must never reach the trainer
        clock = monotonic_clock(time.perf_counter())
        with CountingProxy(server.url, lambda k, m: tally.add("trainer", k, m), clock) as proxy:
            t0 = clock()
            rel = lambda: clock() - t0  # noqa: E731  (0 = the first traffic request)
            load = TrafficGenerator(server.url, prompts, concurrency=args.concurrency,
                                    max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                    clock=rel).start()
            proc = None
            try:
                status = {"phase": "warm-up (traffic only)"}
                tick = ticker(status, rel, load, proxy, train_dir, args.window_s)
                say(f"traffic: {args.concurrency} in flight, {len(prompts)} train prompts, T={args.temperature:g}; "
                    f"warm-up {args.warmup_minutes:g} min")
                wait_until(t0 + 60 * args.warmup_minutes, clock, tick)
                cmd = draft_opd_command(proxy.url, ADMIN_KEY, train_dir, minutes=trainer_minutes(args),
                                        push_every=args.push_every, traffic_items=args.traffic_items,
                                        max_blocks=args.max_blocks, lr=args.lr, traffic_wait_s=args.traffic_wait_s,
                                        extra=shlex.split(args.trainer_args))
                log = run_dir / "train.log"
                proc = start_trainer(cmd, log, len(cores[1]) if cores[1] else args.server_threads)
                t_train = rel()
                status["phase"] = "training"
                say(f"trainer started ({trainer_minutes(args):g} min of training): {' '.join(cmd[3:])}")
                wait_until(t0 + 60 * args.minutes, clock, tick)
                t_end = rel()
                status["phase"] = "end: waiting for the trainer"
                rc = stop_trainer(proc, args.trainer_grace_s)  # traffic flows on until it has pushed and exited
                t_trainer_end = rel()
            finally:  # an interrupted run leaves no trainer behind and stops the traffic
                if proc is not None and proc.poll() is None:
                    stop_trainer(proc, 0.0)
                load.stop()
        if rc != 0:
            say(f"trainer exited with code {rc}; last lines of {log}:\n{_log_tail(log)}")
        info1 = drafter_info(server.url)
        admin.traffic(1)
        spool = admin.last_traffic.stats.model_dump() if admin.last_traffic is not None else None
        eval1 = None
        if args.eval_limit:
            say("held-out evaluation of the final drafter")
            eval1 = heldout_eval(server.url, tok, args)
        admin.close()
    records = load.snapshot()
    _write_requests(run_dir / "requests.jsonl", records)
    trainer = {"command": " ".join(cmd), "exit_code": rc, "start_s": round(t_train, 3),
               "end_s": round(t_trainer_end, 3), "log": str(log), "run_dir": str(train_dir),
               "statuses": tally.snapshot()["errors"]["trainer"], "requests": tally.snapshot()["sent"]["trainer"],
               "malformed_replies": tally.snapshot()["malformed"]["trainer"], **trainer_summary(train_dir)}
    extra = {
        "minutes_requested": args.minutes, "warmup_minutes": args.warmup_minutes, "after_minutes": args.after_minutes,
        "drafter": {"path": str(cfg.drafter), "version_before": info0.get("version"),
                    "version_after": info1.get("version"),
                    "swaps": int(info1.get("swaps", 0)) - int(info0.get("swaps", 0))},
        "load": {"endpoint": "/generate", "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens,
                 "temperature": args.temperature, "prompts": len(prompts), "split": "train",
                 "skipped_too_long": skipped, "max_prompt_tokens": args.max_prompt_tokens,
                 "requests_log": str(run_dir / "requests.jsonl"), "after_end_s": round(t_trainer_end - t_end, 3)},
        "spool": {"purged_before_traffic": purged, "stats_at_end": spool},
        "server": {"config": cfg.name, "dtype": resolve_dtype(cfg.device, cfg.dtype),
                   "traffic_spool_mb": cfg.traffic_spool_mb,
                   "log": str(run_dir / "server.log"),
                   "pinning": {"server_cores": sorted(cores[0]) if cores[0] else None,
                               "client_cores": sorted(cores[1]) if cores[1] else None}},
    }
    if eval0 is not None and eval1 is not None:
        extra["heldout_eval"] = heldout_comparison(eval0, eval1, DOMAINS)
    return assemble_result(records=records, end_s=t_end, warmup_s=60 * args.warmup_minutes,
                           after_s=60 * args.after_minutes, window_s=args.window_s,
                           push_times_s=[t - t0 for t in proxy.swap_times_s], trainer=trainer, extra=extra)


def _write_requests(path: Path, records) -> None:
    from dataclasses import asdict

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for r in records:
            fh.write(json.dumps(asdict(r)) + "\n")
