"""Does on-policy distillation beat continued SFT anywhere, from an SFT start that has plateaued? (issue 52)

Per regime (``--regimes``; :mod:`opd_regimes.regimes`): a server of the regime's drafter architecture
(``--config``, spool and features on) serves the regime's traffic at its temperature while ``specopd adapt
--algorithm sft`` learns from it until the held-out gain plateaus (:mod:`opd_regimes.plateau`); the snapshot
(drafter, optimiser state, frozen train / held-out / rehearsal buffers) is the start of every arm: continued SFT,
SpecOPD (branches at the serving temperature; at T=0 the argmax block and the target's greedy path), Draft-OPD
(``rejected_slots=first``, the snapshot drafter's verify records) and the T=0-aligned ``t0_chain_ce`` objective,
matched on wall clock (``--arm-minutes`` for SFT, the others until SFT's measured wall time) or, regime e's second
budget, on traffic. Each arm's drafter is pushed and measured by the server's own acceptance on the same held-out
prompts (``--eval-prompts`` per domain, >= 24 for the result to count), per seed (``--seeds``), paired with SFT.

Resumable: the snapshot (``<run-dir>/phase_<key>/snapshot/plateau.json``) and every finished arm
(``<run-dir>/<regime>/arms/<arm>.seed<k>/arm.json``) are kept; a rerun with the same settings skips them. ::

    python benchmarks/opd_regimes/run.py --quick                    # every arm of every regime, tiny budgets
    python benchmarks/opd_regimes/run.py --regimes a,b --seeds 0,1  # the full run of two regimes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: opd_regimes/, shift/

from opd_regimes.regimes import ARMS, BASELINE, RegimeError, select  # noqa: E402

DEFAULT_OUT = Path("benchmarks/results/opd_regimes_smollm2_cpu.json")
MIN_EVAL_PROMPTS = 24
FULL = {"plateau_max_steps": 600, "plateau_max_minutes": 60.0, "plateau_verdicts": 3, "plateau_gain": 0.02,
        "eval_every": 25, "arm_minutes": 30.0, "arm_max_steps": 600, "eval_prompts": 24, "eval_max_new_tokens": 64,
        "record_requests": 48, "streams": 3, "max_tokens": 96, "min_holdout": 12, "holdout_window": 48,
        "min_train_tokens": 256, "sizes": {"seqs": 4, "anchors": 16, "branches": 4, "rollout_prompts": 4,
                                           "max_blocks": 64}}
QUICK = {**FULL, "plateau_max_steps": 4, "plateau_max_minutes": 0.75, "plateau_verdicts": 2, "eval_every": 2,
         "arm_minutes": 0.2, "arm_max_steps": 3, "eval_prompts": 2, "eval_max_new_tokens": 16, "record_requests": 4,
         "streams": 2, "max_tokens": 32, "min_holdout": 2, "holdout_window": 8, "min_train_tokens": 32,
         "sizes": {"seqs": 2, "anchors": 4, "branches": 2, "rollout_prompts": 2, "max_blocks": 16}}


def say(text: str) -> None:
    print(f"[opd-regimes {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regimes", default="all", help="letters a-e, comma-separated, or all")
    p.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)} ({BASELINE} always runs)")
    p.add_argument("--seeds", default="0,1", help="arm seeds (each arm's step sampling) from the same snapshot")
    p.add_argument("--quick", action="store_true", help="tiny budgets, 2 prompts per domain, one seed (~20 min)")
    p.add_argument("--config", default="cpu-smollm2-adapt", help="server config (spool and features on)")
    p.add_argument("--drafter-dflash2", default=None, help="start drafter of regime c (default: a fresh one)")
    p.add_argument("--drafter-dspark", default=None, help="start drafter of regime d (default: a fresh one)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--rehearsal", type=float, default=0.25, help="retention: every arm's rehearsal share")
    for k in ("plateau_max_steps", "arm_max_steps", "eval_prompts"):
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    for k in ("plateau_gain", "plateau_max_minutes", "arm_minutes"):
        p.add_argument("--" + k.replace("_", "-"), type=float, default=None)
    p.add_argument("--run-dir", type=Path, default=Path("runs/opd_regimes"))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def settings_of(args) -> dict:
    s = json.loads(json.dumps(QUICK if args.quick else FULL))
    for k in ("plateau_max_steps", "arm_max_steps", "eval_prompts", "plateau_gain", "plateau_max_minutes",
              "arm_minutes"):
        if getattr(args, k) is not None:
            s[k] = getattr(args, k)
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise RegimeError(f"--arms: unknown {bad}; arms: {','.join(ARMS)}")
    return {**s, "seeds": seeds[:1] if args.quick else seeds, "quick": bool(args.quick), "lr": args.lr,
            "rehearsal": args.rehearsal, "config": args.config,
            "arms": [BASELINE] + [a for a in arms if a != BASELINE]}


def run_regimes(args, s: dict, regimes) -> tuple:
    """Run the snapshot and the arms of every regime in ``regimes``; returns ``(entries, missing)``."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.models import KNOWN_MODELS, prepare_model
    from sglang_specopd.app.serve.choice import resolve_drafter
    from sglang_specopd.app.serve.spec import config_path
    from opd_regimes.arms import run_arm
    from opd_regimes.env import regime_server, start_drafter
    from opd_regimes.plateau import sft_snapshot
    from opd_regimes.result import regime_entry

    serve_cfg = ServeConfig.load(config_path(args.config))
    if serve_cfg.traffic_spool_mb <= 0:
        raise RegimeError(f"--config {args.config}: the server must keep a traffic spool (traffic_spool_mb > 0)")
    target = prepare_model(serve_cfg.target) if serve_cfg.target in KNOWN_MODELS else Path(serve_cfg.target)
    shipped = resolve_drafter(serve_cfg, target)
    entries, missing = {}, []
    for key in sorted({r.key for r in regimes}):
        group = [r for r in regimes if r.key == key]
        phase_dir = args.run_dir / f"phase_{key}"
        phase_dir.mkdir(parents=True, exist_ok=True)
        drafter = start_drafter(group[0].arch, target, shipped, getattr(args, f"drafter_{group[0].arch}", None),
                                phase_dir)
        say(f"regime {key}: starting the {group[0].arch} server ({', '.join(r.name for r in group)})")
        with regime_server(group[0], serve_cfg, target, drafter, s) as env:
            snap = sft_snapshot(env, group[0], {**s, "temperature": group[0].temperature}, phase_dir, say)
            plateau = json.loads((snap / "plateau.json").read_text())
            for regime in group:
                rs = {**s, "temperature": regime.temperature}
                records = {a: [] for a in s["arms"]}
                for seed in s["seeds"]:
                    base_wall = None
                    for arm in s["arms"]:
                        say(f"{regime.name}: arm {arm} seed {seed} ({regime.budget} budget"
                            + (f", {base_wall:.0f} s like SFT)" if base_wall else ")"))
                        rec = run_arm(env, regime, arm, seed, snap, rs, args.run_dir / regime.name, base_wall)
                        base_wall = rec["wall_s"] if arm == BASELINE else base_wall
                        records[arm].append(rec)
                        tau = sum(r["completion_tokens"] for r in rec["per_request"]) / max(
                            1, sum(r["verify_steps"] for r in rec["per_request"]))
                        say(f"{regime.name}: arm {arm} seed {seed} done: {rec['wall_s']:.0f} s, {rec['steps']} steps, "
                            f"{rec['supervised_tokens']} supervised tokens, {rec['target_rows']} target rows, "
                            f"served tau {tau:.3f}")
                entries[regime.name] = regime_entry(regime, records, plateau, rs)
    return entries, missing


def main(argv=None) -> int:
    from sglang_specopd.app.results import write_result
    from opd_regimes.plot import plot
    from opd_regimes.regimes import REGIMES
    from opd_regimes.result import assemble

    args = parse(argv)
    try:
        regimes = select(args.regimes)
        s = settings_of(args)
    except RegimeError as exc:
        print(f"opd_regimes: {exc}", file=sys.stderr)
        return 2
    args.run_dir.mkdir(parents=True, exist_ok=True)
    kept = args.run_dir / "settings.json"
    if kept.is_file() and json.loads(kept.read_text()) != s:
        print(f"opd_regimes: {kept} holds a run with other settings; use another --run-dir", file=sys.stderr)
        return 2
    kept.write_text(json.dumps(s) + "\n")
    entries, _ = run_regimes(args, s, regimes)
    missing = [r.name for r in REGIMES if r.name not in entries]
    result = assemble(entries, s, missing)
    result["counts"] = s["eval_prompts"] >= MIN_EVAL_PROMPTS and len(s["seeds"]) >= 2
    path = write_result(args.out, result, command="python " + " ".join(sys.argv))
    plot(result, args.out.with_suffix(".png"))
    say(f"wrote {path}" + ("" if result["counts"] else " (a quick or partial run: below the measurement rule)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
