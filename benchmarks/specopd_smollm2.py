"""SpecOPD vs continued SFT vs sequential-rollout OPD from the SFT drafter, equal budgets, redeployed hot.

Starts ONE SPECOPD server (SmolLM2, bf16, admin key) serving the SFT drafter of ``benchmarks/sft_smollm2.py``;
every trained drafter is pushed into it with the admin hot-swap route and evaluated there (mean acceptance
length per domain on held-out prompts, T=0 and T=1, from SGLang's own per-request statistics). Budget: the same
number of target-scored (supervised) draft tokens for each method:
  (a) continued SFT   anchors x (B-1) labelled positions per step (target responses already collected);
  (b) SpecOPD         anchors x branches x (B-1) per step, one score_trees call per step;
  (c) sequential OPD  verify records x (B-1) per step from real SPECOPD rollouts (drafter pushed every step).
Supervised tokens per second are measured for (b) and (c) over their whole training loops (server calls
included). Writes ``benchmarks/results/specopd_smollm2_cpu.json`` and a plot.

    python benchmarks/specopd_smollm2.py [--sft-run runs/sft_smollm2] [--budget-tokens 24000]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

DOMAINS = ["dialogue", "coding", "math", "agentic"]
ADMIN_KEY = "specopd-bench-admin"


def push(url: str, drafter, version: str) -> None:
    from specopd_trainer.pipeline import push_drafter

    push_drafter(url, drafter, version, ADMIN_KEY)


def evaluate(url, tok, args) -> dict:
    from specopd_trainer.evaluate import evaluate_acceptance

    out = {}
    for temp, key in ((0.0, "T0"), (1.0, "T1")):
        res = evaluate_acceptance(url, tok, DOMAINS, temperature=temp, limit=args.eval_limit,
                                  max_new_tokens=args.eval_max_new_tokens, concurrency=8, progress=False)
        out[key] = {d: res["tau"][d] for d in DOMAINS}
        out[key]["mean"] = res["mean_tau"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-run", default="runs/sft_smollm2")
    ap.add_argument("--run-dir", default="runs/specopd_smollm2")
    ap.add_argument("--out", default="benchmarks/results/specopd_smollm2_cpu.json")
    ap.add_argument("--budget-tokens", type=int, default=24000)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--seqs-per-step", type=int, default=2)
    ap.add_argument("--rollout-prompts", type=int, default=8)
    ap.add_argument("--rollout-tokens", type=int, default=64)
    ap.add_argument("--eval-limit", type=int, default=6)
    ap.add_argument("--eval-max-new-tokens", type=int, default=96)
    ap.add_argument("--port", type=int, default=31400)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from sglang_specopd.config import ServeConfig
    from sglang_specopd.launch import SGLangServer
    from sglang_specopd.models import prepare_model
    from sglang_specopd.results import write_result
    from sglang_specopd.serve import config_path, launch_spec
    from specopd_trainer.client import SpecOPDClient
    from specopd_trainer.collect import iter_responses
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.features import FeatureStore
    from specopd_trainer.loops.engine import run_training
    from specopd_trainer.loops.sequential_opd import collect_rollouts, rollout_step
    from specopd_trainer.loops.sft import SFTConfig, train_sft
    from specopd_trainer.loops.specopd import SpecOPDConfig, specopd_step
    from specopd_trainer.pipeline import split_holdout

    torch.set_num_threads(2)
    sft_run, run = Path(args.sft_run), Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    sft_dir = sft_run / "drafter-sft"
    base = DFlashDrafter.from_pretrained(sft_dir, target)
    G = base.block_size - 1
    store = FeatureStore(sft_run / "features", list(base.spec.target_layer_ids))
    train_seqs, _ = split_holdout(store.load())
    prompts = [list(r.prompt_ids) for r in iter_responses(sft_run / "responses.jsonl")]
    cfg = ServeConfig.load(config_path("cpu-smollm2"))
    spec = launch_spec(cfg, port=args.port, drafter=str(sft_dir), admin_api_key=ADMIN_KEY)
    acceptance, tps, wall, tokens = {}, {}, {}, {}
    with SGLangServer(spec) as server, SpecOPDClient(server.url) as client:
        acceptance["sft_start"] = evaluate(server.url, tok, args)
        print("sft_start", json.dumps(acceptance["sft_start"]), file=sys.stderr)

        # (a) continued SFT on the same target-labelled data, same supervised-token budget
        a = copy.deepcopy(base)
        per_step = 8 * 16 * G
        t0 = time.monotonic()
        train_sft(a, train_seqs, [], run / "sft_continued",
                  SFTConfig(steps=max(1, args.budget_tokens // per_step), lr=3e-4, warmup_steps=2))
        wall["sft_continued"], tokens["sft_continued"] = time.monotonic() - t0, per_step * max(1, args.budget_tokens // per_step)
        push(server.url, a, "sft_continued")
        acceptance["sft_continued"] = evaluate(server.url, tok, args)
        print("sft_continued", json.dumps(acceptance["sft_continued"]), file=sys.stderr)

        # (b) SpecOPD
        b = copy.deepcopy(base)
        scfg = SpecOPDConfig(anchors_per_seq=args.anchors, branches=args.branches, seqs_per_step=args.seqs_per_step,
                             lr=3e-4, warmup_steps=2)
        per_step = args.seqs_per_step * args.anchors * args.branches * G
        steps_b = max(1, args.budget_tokens // per_step)
        counter = {"tokens": 0}

        def step_b(step, gen):
            picks = torch.randint(len(train_seqs), (scfg.seqs_per_step,), generator=gen).tolist()
            loss, m = specopd_step(b, client, [train_seqs[i] for i in picks], scfg, gen)
            loss.backward()
            counter["tokens"] += m["supervised_tokens"]
            return loss.item(), {"est_tau": m["est_tau"], "supervised_tokens": counter["tokens"]}

        t0 = time.monotonic()
        run_training(b, step_b, run / "specopd", steps=steps_b, lr=scfg.lr, warmup_steps=2, min_lr_ratio=0.1,
                     grad_clip=1.0, seed=0, log_every=1, ckpt_every=1000, desc="SpecOPD")
        wall["specopd"], tokens["specopd"] = time.monotonic() - t0, counter["tokens"]
        tps["specopd"] = tokens["specopd"] / wall["specopd"]
        push(server.url, b, "specopd")
        acceptance["specopd"] = evaluate(server.url, tok, args)
        print("specopd", json.dumps(acceptance["specopd"]), tps, file=sys.stderr)

        # (c) sequential-rollout OPD
        c = copy.deepcopy(base)
        counter = {"tokens": 0, "prompt": 0}
        layer_ids = list(base.spec.target_layer_ids)

        def step_c(step, gen):
            push(server.url, c, f"seq-opd-{step}")
            idx = torch.randint(len(prompts), (args.rollout_prompts,), generator=gen).tolist()
            rollouts = collect_rollouts(client, [prompts[i] for i in idx], max_new_tokens=args.rollout_tokens,
                                        temperature=1.0)
            loss, m = rollout_step(c, client, rollouts, layer_ids)
            loss.backward()
            counter["tokens"] += m["supervised_tokens"]
            return loss.item(), {"est_tau": m["est_tau"], "supervised_tokens": counter["tokens"]}

        t0 = time.monotonic()
        est_per_step = args.rollout_prompts * (args.rollout_tokens // 1.3) * G
        run_training(c, step_c, run / "sequential_opd", steps=max(1, int(args.budget_tokens // est_per_step) + 1),
                     lr=3e-4, warmup_steps=2, min_lr_ratio=0.1, grad_clip=1.0, seed=0, log_every=1,
                     ckpt_every=1000, desc="sequential OPD")
        wall["sequential_opd"], tokens["sequential_opd"] = time.monotonic() - t0, counter["tokens"]
        tps["sequential_opd"] = tokens["sequential_opd"] / wall["sequential_opd"]
        push(server.url, c, "sequential_opd")
        acceptance["sequential_opd"] = evaluate(server.url, tok, args)
        print("sequential_opd", json.dumps(acceptance["sequential_opd"]), tps, file=sys.stderr)

    for name, d in (("sft_continued", a), ("specopd", b), ("sequential_opd", c)):
        d.save_pretrained(run / f"drafter-{name}", overwrite=True)
    ratio = tps["specopd"] / tps["sequential_opd"]
    payload = {
        "target": "SmolLM2-135M-Instruct", "start": str(sft_dir), "acceptance": acceptance,
        "supervised_tokens_per_s": tps, "throughput_ratio": ratio, "budget_target_tokens": args.budget_tokens,
        "supervised_tokens": tokens, "wall_s": wall,
        "specopd_config": scfg.model_dump(), "rollout": {"prompts": args.rollout_prompts, "tokens": args.rollout_tokens},
        "floors": {"specopd_beats_continued_sft_T0": acceptance["specopd"]["T0"]["mean"] > acceptance["sft_continued"]["T0"]["mean"],
                   "throughput_ratio_ge_10": ratio >= 10},
    }
    write_result(args.out, payload, command="python " + " ".join(sys.argv))
    _plot(acceptance, tps, Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out}: ratio {ratio:.1f}x", file=sys.stderr)
    return 0


def _plot(acceptance: dict, tps: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ["sft_start", "sft_continued", "specopd", "sequential_opd"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, temp in zip(axes[:2], ("T0", "T1")):
        width = 0.2
        for i, m in enumerate(methods):
            ax.bar([x + (i - 1.5) * width for x in range(len(DOMAINS))],
                   [acceptance[m][temp][d] for d in DOMAINS], width=width, label=m)
        ax.set_xticks(range(len(DOMAINS)), DOMAINS)
        ax.set_title(f"mean acceptance length, {temp}")
    axes[0].legend(fontsize=8)
    axes[2].bar(list(tps), list(tps.values()), color=["tab:green", "tab:red"])
    axes[2].set_title("supervised tokens / s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
