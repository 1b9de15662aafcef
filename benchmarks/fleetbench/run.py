"""SPECOPD workers behind sglang-router (issue 39, part 5): SmolLM2 + the shipped drafter on CPU, 1 vs 2 workers.

(a) Throughput. For each worker count of ``--workers`` (default 1, 2) a fleet of that many SPECOPD workers of
``--config`` (the fleet's own supervisor, :class:`sglang_specopd.app.fleet.supervisor.Fleet`), worker ``i`` pinned to the one
core ``--cores[i]``, behind sglang-router (``--policy``, default round_robin). After an unmeasured warm-up pass, each
``--concurrency`` level sends every held-out prompt once (``--limit`` per domain of dialogue, coding, math, agentic:
the prompts the other benchmarks use, the same for every arm; ``--max-new-tokens``, ignore_eos, greedy) through the
router with that many requests in flight (``specopd bench serve``'s streaming client; every worker's
``/flush_cache`` first). Per level: output tokens/s with a bootstrap 95% interval over prompts, ITL and TTFT
percentiles, errors by status, tau with its interval, each worker's decode steps (how the router spread the work);
per concurrency the paired 2-vs-1 throughput ratio with its interval.

(b) Rollouts under load. On the 2-worker fleet, ``--rollouts`` ``FleetRollout`` transactions (stage, commit,
verify; the serving drafter's weights under new version labels) while ``--rollout-concurrency`` closed-loop
``/generate`` clients go through the router and ``--direct-samplers`` go to each worker directly. Every response
carries the drafter versions that drafted it (the router keeps ``meta_info`` on ``/generate``): none sent after a
commit returned may carry an older version (stale, or mixed); 5xx counted.

(c) ``kill -9`` during a rollout. Per ``--kill-phases`` (``stage``, ``commit``): under the same load, the worker
staged second is killed (its whole process group) just before its stage / commit request: what the transaction did
(abort everywhere, or commit + the worker missed), what the survivor serves, what the router answered (lost
requests, any old-drafter answers after the commit); then the worker is restarted on its port and cores and
``FleetRollout.reconcile``d (``--no-rejoin`` skips that), with what the router answered meanwhile.

(d) Training (``--train-steps`` > 0). On each fleet after its levels: ``specopd train specopd --workers ... --router
...`` (the README's validated recipe, ``--train-steps`` steps, one push at the end) in a subprocess; supervised
tokens/s over the steps after the first with a bootstrap interval over steps, and the paired 2-vs-1 ratio (the same
seed: the same sequences per step). The first fleet's run prepares the training data (``--train-per-domain``
responses per domain through the router), every later run reads the same data. On the last fleet, after the
rollouts: the same command for ``--kill-train-steps`` steps pushing every ``--train-push-every``, a worker killed
(``kill -9``) once step ``--kill-at-step`` is logged and restarted at once: every step must be logged (lost steps:
none), pushes while the worker is down are deferred (every worker keeps its drafter), the final push reaches both.

Result: ``benchmarks/results/fleet_smollm2_cpu.json`` (keys in the shared notes ``results.md``) + a PNG beside it;
written after each phase (``status: "partial"`` until the end). Run on a quiet machine with at least 2 cores::

    python benchmarks/fleetbench/run.py
    python benchmarks/fleetbench/run.py --limit 2 --concurrency 1,2 --max-new-tokens 16 --out /tmp/fleet_smoke.json  # smoke
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DOMAINS = ["dialogue", "coding", "math", "agentic"]
RESULT = Path("benchmarks/results/fleet_smollm2_cpu.json")
MIN_PROMPTS = 24
KILL_PHASES = ("stage", "commit")
INTERVALS_NOTE = (
    "output_tokens_per_s = sum(completion tokens) / level duration = inflight * sum(tokens) / sum(latency); the 95% "
    "interval bootstraps prompts (stratified by domain) for the second factor with inflight held at its measured "
    "value; the 2-vs-1 ratio resamples the same prompts in both arms (paired); rollout phases: bootstrap of the mean "
    "over rollouts; tau: specopd_trainer.intervals.acceptance_intervals")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--drafter", default=None, help="drafter dir (default: the reference drafter shipped for the "
                                                    "config's target)")
    ap.add_argument("--workers", default="1,2", help="worker counts, one fleet each (the largest, if >= 2, also "
                                                     "runs the rollouts and the kill -9 scenarios)")
    ap.add_argument("--cores", default="", help="comma-separated cores, worker i on the i-th (default: the first "
                                                "cores this process may use)")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--limit", type=int, default=MIN_PROMPTS, help="held-out prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=8, help="unmeasured prompts per fleet before its levels")
    ap.add_argument("--policy", default="round_robin", help="the router's --policy (the fleet's default is "
                                                            "cache_aware, which may send shared-prefix chat prompts to "
                                                            "one worker)")
    ap.add_argument("--router-arg", action="append", default=[],
                    help="an extra sglang-router flag (repeatable), e.g. --router-arg=--health-check-interval-secs=10")
    ap.add_argument("--rollouts", type=int, default=5, help="rollouts under load (0: skip part b)")
    ap.add_argument("--rollout-concurrency", type=int, default=8, help="/generate clients through the router during "
                                                                       "rollouts and kills")
    ap.add_argument("--direct-samplers", type=int, default=1, help="/generate clients per worker, sent to it directly")
    ap.add_argument("--rollout-max-new-tokens", type=int, default=32)
    ap.add_argument("--rollout-gap-s", type=float, default=3.0)
    ap.add_argument("--settle-s", type=float, default=5.0, help="load before the first and after the last rollout")
    ap.add_argument("--kill-phases", default=",".join(KILL_PHASES), help="kill -9 scenarios ('' to skip part c)")
    ap.add_argument("--after-kill-s", type=float, default=10.0, help="load after a kill before the restart")
    ap.add_argument("--no-rejoin", action="store_true", help="do not restart and reconcile a killed worker (then only "
                                                             "the first kill phase can run)")
    ap.add_argument("--ttl-s", type=float, default=120.0, help="staged copies' TTL")
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for a fleet (or a restarted worker) to start")
    ap.add_argument("--train-steps", type=int, default=12, help="training steps per fleet (0: skip part d)")
    ap.add_argument("--train-per-domain", type=int, default=4, help="training responses per domain")
    ap.add_argument("--train-max-new-tokens", type=int, default=96, help="training response length")
    ap.add_argument("--kill-train-steps", type=int, default=16, help="steps of the kill -9 training run (0: skip)")
    ap.add_argument("--train-push-every", type=int, default=4, help="pushes of the kill -9 training run")
    ap.add_argument("--kill-at-step", type=int, default=6, help="kill -9 once this training step is logged")
    ap.add_argument("--train-timeout", type=float, default=1800.0, help="seconds for one training run")
    ap.add_argument("--run-dir", type=Path, default=Path("runs/fleet_bench"))
    ap.add_argument("--out", type=Path, default=RESULT)
    return ap.parse_args(argv)


def ints(text: str) -> List[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def pick_cores(spec: str, n: int, available: List[int]) -> List[int]:
    """The cores of the workers: ``spec`` (comma-separated) or the first ``n`` of ``available``.

    Raises ValueError when there are fewer than ``n`` distinct cores or a core is not available."""
    cores = ints(spec) if spec else sorted(available)[:n]
    if len(set(cores)) < n or len(set(cores)) != len(cores):
        raise ValueError(f"{n} workers need {n} distinct cores, got {cores} (available {sorted(available)})")
    missing = sorted(set(cores) - set(available))
    if missing:
        raise ValueError(f"cores {missing} are not available to this process (available {sorted(available)})")
    return cores


def assemble(args, drafter: str, cores: List[int], state: Dict[str, Any], status: str) -> Dict[str, Any]:
    from fleetbench import report, stats, training

    try:
        router_version = metadata.version("sglang-router")
    except metadata.PackageNotFoundError:
        router_version = None
    payload = {
        "status": status, "server_config": args.config, "drafter": drafter, "domains": DOMAINS,
        "limit_per_domain": args.limit, "skipped_prompts": state.get("skipped"), "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature, "warmup_prompts": args.warmup,
        "counts_as_result": args.limit >= MIN_PROMPTS and status == "complete",
        "router": {"package": "sglang-router", "version": router_version, "policy": args.policy,
                   "extra_args": list(args.router_arg)},
        "worker_cores": {str(i): [c] for i, c in enumerate(cores)}, "available_cores": state.get("available_cores"),
        "client_and_router_cores": state.get("client_cores"),
        "server_threads": os.environ.get("SPECOPD_CPU_SERVER_THREADS", "1 (plugin default)"),
        "fleets": state["fleets"], "intervals_note": INTERVALS_NOTE, "levels": state["levels"],
        "scaling": stats.scaling(state["levels"]), "rollout": state.get("rollout"),
        "faults": state["faults"], "training": training.summary(state["training"]),
        "settings": {k: getattr(args, k) for k in ("rollouts", "rollout_concurrency", "direct_samplers",
                                                   "rollout_max_new_tokens", "rollout_gap_s", "settle_s",
                                                   "after_kill_s", "ttl_s")}
        | {"kill_phases": [p for p in args.kill_phases.split(",") if p], "rejoin": not args.no_rejoin},
        "wall_s": time.monotonic() - state["t0"],
    }
    payload["floors"] = report.floors(payload)
    return payload


def run_arm(args, n: int, cores: List[int], drafter: str, admin: str, params, prompts, warm, kill_phases, state,
            save, say, *, last: bool):
    """One fleet of ``n`` workers: its levels (part a) and, on the last arm with >= 2 workers, the rollouts (b)
    and the kill -9 scenarios (c); appends to ``state``, saves after each phase. Returns (prompts, warm-up
    prompts), loaded with the first fleet's tokenizer."""
    from fleetbench import phases, training

    say(f"== {n} worker(s) on cores {cores[:n]} behind sglang-router ({args.policy})")
    with phases.started_fleet(args.config, n, cores, drafter=drafter, run_dir=args.run_dir / f"workers{n}",
                              admin_key=admin, policy=args.policy, router_args=args.router_arg,
                              timeout=args.timeout, say=say) as fl:
        state["fleets"][str(n)] = {"start_s": fl.start_s, "router": fl.router_url,
                                   "workers": [{"url": w.url, "cores": list(w.cpu_cores or [])} for w in fl.workers]}
        if prompts is None:
            from transformers import AutoTokenizer

            from sglang_specopd.app.bench.runner import load_prompts

            tok = AutoTokenizer.from_pretrained(fl.specs[0].model_path)
            prompts, state["skipped"] = load_prompts(tok, DOMAINS, args.limit)
            warm = [p for d in DOMAINS for p in load_prompts(tok, [d], args.limit + 2)[0][args.limit:]]
            warm = warm[: args.warmup]
        say(f"ready in {fl.start_s:.0f} s; warm-up ({len(warm)} prompts)")
        phases.warm_up(fl, warm, params, timeout_s=args.request_timeout)
        for c in ints(args.concurrency):
            t = time.monotonic()
            lv = phases.measure_level(fl, prompts, c, params, timeout_s=args.request_timeout, admin_key=admin)
            state["levels"].append(lv)
            ci = lv["output_tokens_per_s_ci95"] or [float("nan")] * 2
            say(f"  c={c}: {lv['output_tokens_per_s']:.2f} tok/s [{ci[0]:.2f}, {ci[1]:.2f}], ITL p99 "
                f"{lv['itl_p99_s'] or float('nan'):.3f} s, errors {lv['errors']} (5xx {lv['errors_5xx']}), "
                f"decode steps {list(lv['worker_decode_steps'].values())} ({time.monotonic() - t:.0f} s)")
        save("partial")
        if args.train_steps > 0:
            say(f"== training against {n} worker(s)")
            state["training"][str(n)] = training.fleet_run(fl, args, admin, state, DOMAINS, say)
            save("partial")
        if not last or n < 2 or (args.rollouts <= 0 and not kill_phases and args.kill_train_steps <= 0):
            return prompts, warm
        ro = phases.Rollouts(fl, drafter, admin, ttl_s=args.ttl_s, probe_ids=list(prompts[0].prompt_ids[:16]))
        try:
            load_kw = dict(concurrency=args.rollout_concurrency, direct=args.direct_samplers,
                           max_new_tokens=args.rollout_max_new_tokens, settle_s=args.settle_s)
            ids = [p.prompt_ids for p in prompts]
            if args.rollouts > 0:
                say(f"== {args.rollouts} rollouts under load (router c={args.rollout_concurrency})")
                state["rollout"] = phases.measure_rollouts(fl, ro, ids, n=args.rollouts, gap_s=args.rollout_gap_s,
                                                           say=say, **load_kw)
                save("partial")
            for phase in kill_phases:
                say(f"== kill -9 of a worker at its {phase}")
                state["faults"].append(phases.kill_scenario(
                    fl, ro, ids, phase=phase, after_kill_s=args.after_kill_s, rejoin=not args.no_rejoin,
                    timeout=args.timeout, log_dir=args.run_dir / f"workers{n}", say=say, **load_kw))
                save("partial")
            if args.kill_train_steps > 0:
                say(f"== kill -9 of a worker during training (after step {args.kill_at_step})")
                state["faults"].append(training.kill_during_training(
                    fl, admin, args.run_dir / "train-kill", state["train_data"] or ",".join(DOMAINS),
                    steps=args.kill_train_steps, push_every=args.train_push_every, kill_at=args.kill_at_step,
                    per_domain=args.train_per_domain, max_new_tokens=args.train_max_new_tokens,
                    rejoin=not args.no_rejoin, timeout_s=args.train_timeout, start_timeout=args.timeout,
                    log_dir=args.run_dir / f"workers{n}", say=say))
                save("partial")
        finally:
            ro.close()
    return prompts, warm


def main(argv=None) -> int:
    args = parse(argv)
    import signal

    if argv is None:  # run as a script: SIGTERM unwinds like Ctrl-C (the fleets' context managers stop every
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # worker and router it started)
    from concurrency_reference.run import shipped_reference
    from fleetbench.plot import plot

    from sglang_specopd.app.bench.client import RequestParams
    from sglang_specopd.app.fleet.plan import available_cores
    from sglang_specopd.app.results import write_result

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    workers = sorted(set(ints(args.workers)))
    kill_phases = [p for p in args.kill_phases.split(",") if p]
    if not workers or min(workers) < 1 or set(kill_phases) - set(KILL_PHASES):
        say(f"error: --workers must be >= 1 and --kill-phases among {KILL_PHASES}")
        return 2
    if args.kill_train_steps > 0 and not 1 <= args.kill_at_step < args.kill_train_steps:
        say(f"error: --kill-at-step must be in [1, --kill-train-steps) = [1, {args.kill_train_steps})")
        return 2
    if args.no_rejoin and len(kill_phases) > 1:
        say("error: --no-rejoin leaves one worker after the first kill: pass one --kill-phases")
        return 2
    avail = available_cores()
    try:
        cores = pick_cores(args.cores, max(workers), avail)
    except ValueError as e:
        say(f"error: {e}")
        return 2
    drafter = args.drafter or shipped_reference(args.config)
    if drafter is None:
        say(f"error: no reference drafter ships for {args.config}'s target; pass --drafter")
        return 2
    rest = sorted(set(avail) - set(cores))
    if rest:  # the router (started from here) and the client off the workers' cores when the machine has more
        os.sched_setaffinity(0, rest)
    state: Dict[str, Any] = {"t0": time.monotonic(), "levels": [], "fleets": {}, "faults": [], "rollout": None,
                             "training": {}, "train_data": None,
                             "available_cores": avail, "client_cores": rest or "shared with the workers"}
    command = "python " + " ".join(["benchmarks/fleetbench/run.py", *(argv if argv is not None else sys.argv[1:])])
    admin = secrets.token_hex(16)
    params = RequestParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, ignore_eos=True)

    def save(status: str) -> Dict[str, Any]:
        payload = assemble(args, drafter, cores, state, status)
        write_result(args.out, payload, command=command)
        return payload

    try:
        prompts, warm = None, []
        for n in workers:
            prompts, warm = run_arm(args, n, cores, drafter, admin, params, prompts, warm, kill_phases, state, save,
                                    say, last=n == max(workers))
    except BaseException as e:
        if state["levels"]:  # keep what was measured
            save(f"failed: {type(e).__name__}: {e}"[:300])
        raise
    payload = save("complete")
    png = plot(payload, args.out.with_suffix(".png"))
    from fleetbench.report import print_summary

    print_summary(payload, say)
    say(f"wrote {args.out} and {png} in {payload['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
