"""Live-training soak: serving latency, errors, scheduler memory and greedy output while a trainer trains hot.

One SPECOPD server (default ``cpu-smollm2-fp32``, with the per-iteration scoring budget
``score_trees_budget_tokens`` set by ``--budget``) serves a plain load: ``--streams`` concurrent streams of the four
domains' held-out prompts (``/v1/completions``, the bench client's ``run_level``), plus a fuzzer sending malformed
score_trees / swap / generate requests at ``--fuzz-rate`` per second. First an idle phase (the load alone), then a
training phase: ``specopd train specopd`` runs against the server (through a counting proxy), starting from the
server's drafter and pushing it hot every ``--push-every`` steps. Recorded: TTFT / ITL p50 and p99 per phase (the
training phase starts at the trainer's first score_trees call), errors by HTTP status per source, malformed
replies, the scheduler's RSS every 5 s, swaps, the greedy outputs of 4 probe prompts before and after, and the
score_trees queue waits of the training phase (the server's ``X-SpecOPD-Queue-Wait-S`` on the trainer's replies and
on the fuzzer's small valid requests: ``score_queue_wait_p99_s``, p50, max, 429s; bounded by the config's
``score_trees_queue_wait_s``).

Why fp32: greedy identity before vs after is only meaningful where outputs are batch-invariant; speculative
decoding is lossless, so in fp32 the probes must match although the drafter changed (the comparison is with
the trained drafter serving, not a restored one). Pinning: the server runs on ``--server-cores``, everything else
(load, fuzzer, proxy, trainer) on ``--client-cores``, so the ITL ratio measures the scheduler sharing its time.

Then, for every budget of ``--curve-budgets`` (a fresh server each), ``--curve-minutes`` of load + trainer give
one point of serving ITL p99 against the trainer's supervised tokens/s. Floors: ITL p99 training/idle <= 2, no
5xx, scheduler RSS growth <= 10 % (after a warm-up minute of training), identical probes. Writes
``benchmarks/results/live_training_soak_cpu.json`` and a plot beside it::

    python benchmarks/soak/run.py --minutes 20 --curve-budgets 256,1024,0
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the soak/ package

from soak import stats  # noqa: E402
from soak.procs import parse_cores  # noqa: E402

BUDGET_KEY = "score_trees_budget_tokens"


class SoakError(RuntimeError):
    """A bad option or a setup the soak cannot run with (one line for the user)."""


def parse_budgets(text: str) -> list:
    """``"256,1024,0"`` -> [256, 1024, 0]; ``""`` -> []; raises SoakError for a non-integer or negative one."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SoakError(f"--curve-budgets {text!r}: expected a comma list of integers (tokens; 0 = unbounded)")
    if any(b < 0 for b in out):
        raise SoakError(f"--curve-budgets {text!r}: budgets must be >= 0")
    return out


def budget_key_supported() -> bool:
    """Whether this checkout's ServeConfig has the scoring-budget key."""
    from sglang_specopd.app.config import ServeConfig

    return BUDGET_KEY in ServeConfig.model_fields


def serve_config(config: str, budget):
    """(ServeConfig, budget) of ``config`` with ``score_trees_budget_tokens`` = ``budget`` (None: the config's).

    Raises SoakError when this checkout's ServeConfig has no such key or the value is invalid.
    """
    from pydantic import ValidationError

    from sglang_specopd.app.config import ConfigError, ServeConfig
    from sglang_specopd.app.serve.spec import config_path

    if not budget_key_supported():
        raise SoakError(f"server config key {BUDGET_KEY!r} does not exist in this checkout "
                        "(sglang_specopd/app/config.py ServeConfig): the soak needs the per-iteration scoring budget")
    try:
        cfg = ServeConfig.load(config_path(config))
        if budget is not None:
            cfg = ServeConfig.model_validate({**cfg.model_dump(), BUDGET_KEY: budget})
    except (ConfigError, ValidationError) as exc:
        raise SoakError(f"--config {config} with {BUDGET_KEY}={budget}: {exc}".replace("\n", " ")) from None
    return cfg, getattr(cfg, BUDGET_KEY)


def pinning(args):
    """(server cores, client cores) or (None, None) when pinning is off or impossible (a single usable core)."""
    if args.no_pin:
        return None, None
    allowed = os.sched_getaffinity(0)
    try:
        server, client = parse_cores(args.server_cores), parse_cores(args.client_cores)
    except ValueError as exc:
        raise SoakError(f"--server-cores/--client-cores: {exc}") from None
    if len(allowed) < 2:
        print("only one usable core: running unpinned", file=sys.stderr)
        return None, None
    if not (server | client) <= allowed or server & client:
        raise SoakError(f"cores {sorted(server)} (server) and {sorted(client)} (client) must be disjoint and within "
                        f"the usable cores {sorted(allowed)}")
    return server, client


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="soak length: idle + training phase (minutes)")
    ap.add_argument("--idle-minutes", type=float, default=None, help="idle phase (default: min(4, minutes / 4))")
    ap.add_argument("--config", default="cpu-smollm2-fp32", help="server config (name or YAML path)")
    ap.add_argument("--budget", type=int, default=None, help=f"{BUDGET_KEY} of the soak (default: the config's)")
    ap.add_argument("--curve-budgets", default="256,1024,0", help="budgets of the trade-off curve ('' = none)")
    ap.add_argument("--curve-minutes", type=float, default=4.0, help="training minutes per curve point")
    ap.add_argument("--load-warmup-s", type=float, default=30.0, help="load before the idle phase, not measured")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompts-per-domain", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens per load request (T=0, EOS ignored)")
    ap.add_argument("--probe-tokens", type=int, default=32)
    ap.add_argument("--fuzz-rate", type=float, default=0.5, help="malformed requests per second")
    ap.add_argument("--push-every", type=int, default=8)
    ap.add_argument("--per-domain", type=int, default=8, help="trainer data: train prompts per domain")
    ap.add_argument("--data-max-new-tokens", type=int, default=128)
    ap.add_argument("--trainer-args", default="", help="extra `specopd train specopd` options, e.g. '--anchors 4'")
    ap.add_argument("--trainer-grace-s", type=float, default=240.0,
                    help="how long past its --max-minutes the trainer may run (start-up, final push) before SIGTERM")
    ap.add_argument("--rss-warmup-s", type=float, default=60.0)
    ap.add_argument("--server-cores", default="0")
    ap.add_argument("--client-cores", default="1")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--server-threads", type=int, default=1, help="server threads when unpinned")
    ap.add_argument("--port", type=int, default=31520)
    ap.add_argument("--run-dir", default="runs/live_training_soak")
    ap.add_argument("--out", default="benchmarks/results/live_training_soak_cpu.json")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except SoakError as exc:
        print(f"live_training_soak: {exc}", file=sys.stderr)
        return 2


def run(args) -> int:
    from soak.plot import save_plot
    from soak.session import idle_minutes, run_curve, run_soak

    from sglang_specopd.app.results import write_result

    if args.minutes <= 0 or args.curve_minutes <= 0:
        raise SoakError("--minutes and --curve-minutes must be > 0")
    if not 0 < idle_minutes(args) < args.minutes:
        raise SoakError(f"--idle-minutes {idle_minutes(args):g} must be in (0, --minutes {args.minutes:g})")
    budgets = parse_budgets(args.curve_budgets)
    cfg, budget = serve_config(args.config, args.budget)
    for b in budgets:
        serve_config(args.config, b)  # every curve budget is valid before anything starts
    cores = pinning(args)
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    payload = run_soak(args, cfg, budget, cores)
    payload["curve"] = [run_curve(args, serve_config(args.config, b)[0], b, cores) for b in budgets]
    payload["wall_s"] = time.monotonic() - t0
    out = write_result(args.out, payload, command="python " + " ".join(sys.argv))
    save_plot(payload, out.with_suffix(".png"))
    verdict = "PASS" if payload["floors_pass"] else "FAIL"
    print(f"wrote {out}: floors {verdict} " + ", ".join(f"{k}={'ok' if f['pass'] else 'FAIL'}"
                                                       for k, f in payload["floors"].items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
