"""Draft-OPD on live traffic: a loaded SPECOPD server keeps serving while a trainer learns from what it served.

One SPECOPD server (default config ``cpu-smollm2``, bf16) serving ``--drafter DIR``, with the traffic spool on
(``traffic_spool_mb`` = ``--spool-mb``, docs/live_traffic.md) and an admin key. A load generator sends the four
domains' TRAIN-split prompts (``domain_split(d)[0]``, never held-out ones) through ``/generate``, ``--concurrency``
requests in flight, for ``--minutes``, T=``--temperature`` (0), ``--max-new-tokens`` (96), recording per request its
send / finish time, status, SGLang's acceptance statistics and the drafter versions that served it. After
``--warmup-minutes`` of traffic alone (the "before" span), ``specopd train draft-opd --from-traffic`` starts beside
it (through a counting proxy: its statuses and the hot-push times), training on the recorded traffic and pushing
the drafter hot every ``--push-every`` steps; its ``--max-minutes`` ends it (final push included) about
``--trainer-startup-minutes`` before the run ends, and the traffic flows until it has exited.

Recorded (``benchmarks/results/draft_opd_live_traffic_smollm2_cpu.json`` + a PNG beside it): ``live_traffic``
{minutes, tau_before, tau_after (the last ``--after-minutes``), pushes, serving_errors, requests_served}, tau per
``--window-s`` window, per drafter version, errors by status, the trainer's steps and metrics summary, the push
times. Traffic tau before and after comes from different requests (no paired comparison; see ``note``);
``--eval-limit N`` adds the initial and final drafter on the same N held-out prompts per domain with a paired
bootstrap difference (the held-out requests are purged from the spool before the trainer starts)::

    python benchmarks/live_traffic/run.py --drafter runs/reference_drafter/drafter --minutes 15
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the soak/ and live_traffic/ packages

from soak.run import SoakError, pinning  # noqa: E402


class LiveTrafficError(RuntimeError):
    """A bad option or a setup this benchmark cannot run with (one line for the user)."""


def serve_config(config: str, drafter: str, spool_mb: float):
    """The ServeConfig of ``config`` serving ``drafter`` with a ``spool_mb`` MiB traffic spool; raises
    LiveTrafficError for an invalid value or a config that does not run SPECOPD (only SPECOPD servers record)."""
    from pydantic import ValidationError

    from sglang_specopd.app.config import ConfigError, ServeConfig
    from sglang_specopd.app.serve.spec import config_path

    try:
        cfg = ServeConfig.load(config_path(config))
        cfg = ServeConfig.model_validate({**cfg.model_dump(), "drafter": str(Path(drafter).expanduser().resolve()),
                                          "traffic_spool_mb": spool_mb})
    except (ConfigError, ValidationError) as exc:
        raise LiveTrafficError(f"--config {config} with traffic_spool_mb={spool_mb}: {exc}".replace("\n", " "))
    if cfg.speculative_algorithm != "SPECOPD":
        raise LiveTrafficError(f"--config {config} runs {cfg.speculative_algorithm}: only a SPECOPD server records "
                               "its traffic")
    return cfg


def check_options(args) -> None:
    """Raise LiveTrafficError for options that cannot make a run (before anything starts)."""
    from live_traffic.session import trainer_minutes

    if not Path(args.drafter).expanduser().is_dir():
        raise LiveTrafficError(f"--drafter {args.drafter}: not a directory")
    if args.minutes <= 0 or not 0 < args.warmup_minutes < args.minutes:
        raise LiveTrafficError(f"--warmup-minutes {args.warmup_minutes:g} must be in (0, --minutes {args.minutes:g})")
    if not 0 < args.after_minutes <= args.minutes - args.warmup_minutes:
        raise LiveTrafficError(f"--after-minutes {args.after_minutes:g} must be in (0, --minutes - --warmup-minutes "
                               f"= {args.minutes - args.warmup_minutes:g}]")
    if trainer_minutes(args) <= 0:
        raise LiveTrafficError(f"no training time left: --minutes {args.minutes:g} - --warmup-minutes "
                               f"{args.warmup_minutes:g} - --trainer-startup-minutes {args.trainer_startup_minutes:g}")
    if args.concurrency < 1 or args.max_new_tokens < 2 or args.window_s <= 0 or args.eval_limit < 0:
        raise LiveTrafficError("need --concurrency >= 1, --max-new-tokens >= 2, --window-s > 0, --eval-limit >= 0")
    if args.spool_mb <= 0:
        raise LiveTrafficError(f"--spool-mb {args.spool_mb:g}: the traffic spool must be on (> 0)")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True, help="drafter directory the server starts with (a trained one)")
    ap.add_argument("--config", default="cpu-smollm2", help="server config (name or YAML path), SPECOPD")
    ap.add_argument("--spool-mb", type=float, default=64.0, help="traffic_spool_mb of the server")
    ap.add_argument("--minutes", type=float, default=15.0, help="traffic length, warm-up included")
    ap.add_argument("--warmup-minutes", type=float, default=2.0, help="traffic alone before the trainer (before)")
    ap.add_argument("--after-minutes", type=float, default=3.0, help="the last span of the run (after)")
    ap.add_argument("--window-s", type=float, default=60.0, help="tau per window of this many seconds")
    ap.add_argument("--concurrency", type=int, default=4, help="traffic requests in flight")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer train prompts are not sent")
    ap.add_argument("--seed", type=int, default=0, help="order of the traffic prompts")
    ap.add_argument("--push-every", type=int, default=2, help="trainer: hot push every N steps")
    ap.add_argument("--traffic-items", type=int, default=32, help="trainer: most traffic items read per step")
    ap.add_argument("--max-blocks", type=int, default=64, help="trainer: most replayed blocks per step")
    ap.add_argument("--lr", type=float, default=1e-4, help="trainer: peak learning rate")
    ap.add_argument("--traffic-wait-s", type=float, default=120.0, help="trainer: wait for usable traffic")
    ap.add_argument("--trainer-args", default="", help="extra `specopd train draft-opd` options (they win)")
    ap.add_argument("--trainer-startup-minutes", type=float, default=1.0,
                    help="trainer --max-minutes = minutes - warm-up - this (its start-up and last step)")
    ap.add_argument("--trainer-grace-s", type=float, default=300.0,
                    help="how long past the end the trainer may run (last step, final push) before SIGTERM")
    ap.add_argument("--eval-limit", type=int, default=0,
                    help="held-out prompts per domain for the paired initial-vs-final evaluation (0 = none)")
    ap.add_argument("--server-cores", default="0")
    ap.add_argument("--client-cores", default="1")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--server-threads", type=int, default=1, help="server threads when unpinned")
    ap.add_argument("--port", type=int, default=31540)
    ap.add_argument("--run-dir", default="runs/draft_opd_live_traffic")
    ap.add_argument("--out", default="benchmarks/results/draft_opd_live_traffic_smollm2_cpu.json")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from sglang_specopd.app.launch.process import ServeError

    args = parse_args(argv)
    try:
        return run(args)
    except (LiveTrafficError, SoakError, ServeError) as exc:
        print(f"draft_opd_live_traffic: {exc}".replace("\n", " "), file=sys.stderr)
        return 2


def run(args) -> int:
    from live_traffic.plot import save_plot
    from live_traffic.session import run_live
    from soak.session import ADMIN_KEY

    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.spec import launch_spec

    check_options(args)
    cfg = serve_config(args.config, args.drafter, args.spool_mb)
    launch_spec(cfg, port=args.port, admin_api_key=ADMIN_KEY)  # target, drafter and port checked before starting
    cores = pinning(args)
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    payload = run_live(args, cfg, cores)
    payload["wall_s"] = round(time.monotonic() - t0, 1)
    out = write_result(args.out, payload, command="python " + " ".join(sys.argv))
    save_plot(payload, out.with_suffix(".png"))
    live = payload["live_traffic"]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"wrote {out}: tau before {fmt(live['tau_before'])}, after {fmt(live['tau_after'])}, {live['pushes']} "
          f"pushes, {live['serving_errors']} serving errors, {live['requests_served']} requests served, trainer "
          f"{payload['trainer']['steps']} steps (exit {payload['trainer']['exit_code']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
