"""SpecOPD vs continued SFT vs sequential-rollout OPD from the SFT drafter, equal budgets, redeployed hot.

Starts ONE SPECOPD server (SmolLM2, bf16, admin key) serving the SFT drafter of ``benchmarks/sft_smollm2/run.py``;
every trained drafter is pushed into it with the admin hot-swap route and evaluated there (mean acceptance
length per domain on held-out prompts, T=0 and T=1, from SGLang's own per-request statistics). Budget: the same
number of target-scored (supervised) draft tokens for each method:
  (a) continued SFT   anchors x (B-1) labelled positions per step (target responses already collected);
  (b) SpecOPD         seqs x (anchors x branches x (B-1) + root anchors) per step, one score_trees call per step;
  (c) sequential OPD  verify records x (B-1) per step from real SPECOPD rollouts (drafter pushed every step).
Supervised tokens per second are measured for (b) and (c) over their whole training loops (server calls
included). Writes ``benchmarks/results/specopd_smollm2_cpu.json`` and a plot.

    python benchmarks/specopd_smollm2/run.py [--sft-run runs/sft_smollm2_big] [--budget-tokens 229376]

The start is the plateaued SFT drafter of
``python benchmarks/sft_smollm2/run.py --run-dir runs/sft_smollm2_big --out runs/sft_smollm2_big/result.json
--per-domain 100 --max-new-tokens 160 --minutes 60`` (its result is committed as
``benchmarks/results/sft_smollm2_big_cpu.json``). SpecOPD's settings (8 branch anchors x 7 branches + 64 root
anchors per sequence, 2 sequences per step, LR 1e-3, E2E-KL with accepted-prefix weights) were chosen on validation
prompts by the one-off ``specopd_sweep.py``, since removed (``specopd_sweep_is_smollm2_cpu.json``,
``specopd_sweep_root_smollm2_cpu.json``), never on the held-out eval prompts reported here.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path

DOMAINS = ["dialogue", "coding", "math", "agentic"]
ADMIN_KEY = "specopd-bench-admin"


class _BudgetReached(Exception):
    """The sequential baseline has consumed its supervised-token budget."""


def push(url: str, drafter, version: str) -> None:
    from specopd_trainer.pipeline import push_drafter

    push_drafter(url, drafter, version, ADMIN_KEY)


def evaluate(url, tok, max_new_tokens: int, limit=None, records=None) -> dict:
    """Mean acceptance length per domain and their mean, at T=0 and T=1: ``{"T0": {domain: tau, "mean": ...}, ...}``.
    Prompts: the eval split (``limit`` per domain) or ``records`` (domain -> prompt records)."""
    from specopd_trainer.evaluate import evaluate_acceptance

    out = {}
    for temp, key in ((0.0, "T0"), (1.0, "T1")):
        res = evaluate_acceptance(url, tok, DOMAINS, temperature=temp, limit=limit, records=records,
                                  max_new_tokens=max_new_tokens, concurrency=8, progress=False)
        out[key] = {d: res["tau"][d] for d in DOMAINS}
        out[key]["mean"] = res["mean_tau"]
    return out


def continued_sft_config(budget_tokens: int, g: int, lr: float):
    """The continued-SFT arm: 8 sequences x 16 anchors x ``g`` labelled slots per step, as many steps as the
    supervised-token budget buys; returns (SFTConfig, supervised tokens it trains on)."""
    from specopd_trainer.algorithms.sft.config import SFTConfig

    per_step = 8 * 16 * g
    steps = max(1, round(budget_tokens / per_step))
    return SFTConfig(steps=steps, lr=lr, warmup_steps=2), per_step * steps


def specopd_config(budget_tokens: int, g: int, *, anchors_per_seq: int, branches: int, seqs_per_step: int,
                   lr: float, temperature: float = 1.0, greedy_branch: bool = False, loss: str = "e2e_tv",
                   reference_branch: float = 0.0, root_anchors: int = 0, minibatches: int = 1,
                   compute_dtype: str = "float32"):
    """The SpecOPD arm: seqs x (anchors x branches x ``g`` supervised branch tokens (branches + 1 with the
    reference branch) + root anchors x 1 slot-1 token) per step, as many steps as the budget buys (a multiple of
    ``minibatches``: whole scored batches), every step logged, no mid-run checkpoints."""
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig

    cfg = SpecOPDConfig(anchors_per_seq=anchors_per_seq, branches=branches, seqs_per_step=seqs_per_step,
                        temperature=temperature, greedy_branch=greedy_branch, loss=loss, lr=lr, warmup_steps=2,
                        reference_branch=reference_branch, root_anchors_per_seq=root_anchors, log_every=1,
                        ckpt_every=10**6, minibatches=minibatches, compute_dtype=compute_dtype)
    per_step = seqs_per_step * (anchors_per_seq * cfg.branches_per_anchor * g + root_anchors)
    batches = max(1, round(budget_tokens / per_step / minibatches))
    return cfg.model_copy(update={"steps": batches * minibatches})


def prepare_references(refs_dir: Path, tok, layer_ids, *, offset: int, per_domain: int, max_new_tokens: int,
                       port: int) -> list:
    """Greedy target responses (and their context features) for the train-split prompts ``[offset, offset +
    per_domain)`` of every domain (:func:`specopd_trainer.pipeline.train_split_records`; the SFT start used the
    first 100 per domain and the validation sweep uses 100..107, so the default offset 108 overlaps neither, nor
    the eval split), from a plain SGLang server, cached under ``refs_dir`` (a re-run resumes). Returns every
    sequence (none is held out: evaluation uses other prompts).

    Why fresh references: the SFT start memorized its own training responses (first-slot greedy agreement with
    the target 0.96 there vs 0.18 on held-out responses, ``sft_memorization_cpu.json``, from a removed
    one-off script: docs/journal.md), so on-policy
    supervision at anchors of those responses carries almost no signal. Every arm trains on these new prompts.
    """
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.pipeline import prepare_sequences, train_split_records

    plain = ServeConfig.load(config_path("cpu-smollm2-plain"))
    with SGLangServer(launch_spec(plain, port=port)) as server, SpecOPDClient(server.url) as client:
        train, hold = prepare_sequences(client, tok, layer_ids, refs_dir, max_new_tokens=max_new_tokens,
                                        records=train_split_records(offset, per_domain))
    return hold + train


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-run", default="runs/sft_smollm2_big")
    ap.add_argument("--run-dir", default="runs/specopd_smollm2")
    ap.add_argument("--out", default="benchmarks/results/specopd_smollm2_cpu.json")
    ap.add_argument("--refs-dir", default="runs/specopd_refs",
                    help="fresh target responses every arm trains on (collected here once, then cached)")
    ap.add_argument("--refs-offset", type=int, default=108)
    ap.add_argument("--refs-per-domain", type=int, default=60)
    ap.add_argument("--budget-tokens", type=int, default=229376)
    ap.add_argument("--anchors", type=int, default=8)
    ap.add_argument("--branches", type=int, default=7)
    ap.add_argument("--seqs-per-step", type=int, default=2)
    ap.add_argument("--rollout-prompts", type=int, default=16)
    ap.add_argument("--rollout-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0, help="SpecOPD branch sampling temperature")
    ap.add_argument("--greedy-branch", action=argparse.BooleanOptionalAction, default=False,
                    help="SpecOPD branch 0 is the argmax block (the served DFLASH proposal)")
    ap.add_argument("--reference-branch", type=float, default=0.0,
                    help="SpecOPD: lambda of the reference (T=0 path) branch per anchor (loss e2e_fkl_is; 0 = off)")
    ap.add_argument("--root-anchors", type=int, default=64,
                    help="SpecOPD: extra anchors per sequence scored at the tree root only (slot 1; loss e2e_fkl(_is))")
    ap.add_argument("--minibatches", type=int, default=1,
                    help="SpecOPD: optimizer steps per scored batch (minibatches x the anchors scored in one call)")
    ap.add_argument("--compute-dtype", default="float32", choices=["bfloat16", "float32"],
                    help="SpecOPD: autocast dtype of the drafter forward")
    ap.add_argument("--loss", default="e2e_fkl_is",
                    help="SpecOPD's proposal-tree loss (e2e_tv, e2e_fkl, tv, fkl, rkl; see specopd_kernels.losses)")
    ap.add_argument("--extra-losses", nargs="*", default=[], metavar="LOSS",
                    help="also run SpecOPD with these proposal-tree losses (tv, fkl, rkl), reported as specopd_LOSS")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak LR of every arm (SpecOPD: see --specopd-lr)")
    ap.add_argument("--specopd-lr", type=float, default=None, help="SpecOPD's peak LR (default: --lr)")
    ap.add_argument("--sequential-max-minutes", type=float, default=None,
                    help="stop the sequential arm after this many minutes even below the budget (recorded in "
                         "phases_s.sequential_opd.stopped_by_time; its tokens/s stay exact)")
    ap.add_argument("--eval-limit", type=int, default=8)
    ap.add_argument("--eval-max-new-tokens", type=int, default=96)
    ap.add_argument("--server-threads", type=int, default=2,
                    help="CPU server intra-op threads (the trainer waits while the server works, so both cores)")
    ap.add_argument("--port", type=int, default=31400)
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from an existing --out JSON")
    args = ap.parse_args(argv)
    if args.plot_only:
        res = json.loads(Path(args.out).read_text())
        _plot(res["acceptance"], res["supervised_tokens_per_s"], res["supervised_tokens_per_s_collection"],
              Path(args.out).with_suffix(".png"))
        return 0

    import torch
    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.server.sampled_drafts import draft_sampling_mode
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import iter_responses
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.loops.engine import run_training
    from specopd_trainer.algorithms.sequential_opd.rollouts import Rollout, collect_rollouts, rollout_step
    from specopd_trainer.algorithms.sft.loop import train_sft
    from specopd_trainer.algorithms.specopd.loop import train_specopd

    torch.set_num_threads(2)
    os.environ["SPECOPD_CPU_SERVER_THREADS"] = str(args.server_threads)  # read by launch.server_env on CPU
    sft_run, run = Path(args.sft_run), Path(args.run_dir)
    for sub in ("sft_continued", "specopd", "sequential_opd"):  # a benchmark starts fresh (the engine would resume)
        shutil.rmtree(run / sub, ignore_errors=True)
    run.mkdir(parents=True, exist_ok=True)
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    sft_dir = sft_run / "drafter-sft"
    base = DFlashDrafter.from_pretrained(sft_dir, target)
    G = base.block_size - 1
    refs_dir = Path(args.refs_dir)
    train_seqs = prepare_references(refs_dir, tok, list(base.spec.target_layer_ids), offset=args.refs_offset,
                                    per_domain=args.refs_per_domain, max_new_tokens=160, port=args.port + 1)
    prompts = [list(r.prompt_ids) for r in iter_responses(refs_dir / "responses.jsonl")]
    cfg = ServeConfig.load(config_path("cpu-smollm2"))
    spec = launch_spec(cfg, port=args.port, drafter=str(sft_dir), admin_api_key=ADMIN_KEY)
    acceptance, tps, wall, tokens = {}, {}, {}, {}
    with SGLangServer(spec) as server, SpecOPDClient(server.url, admin_api_key=ADMIN_KEY) as client:
        acceptance["sft_start"] = evaluate(server.url, tok, args.eval_max_new_tokens, limit=args.eval_limit)
        print("sft_start", json.dumps(acceptance["sft_start"]), file=sys.stderr)

        # (a) continued SFT on the same target-labelled data, same supervised-token budget
        a = copy.deepcopy(base)
        sft_cfg, sft_tokens = continued_sft_config(args.budget_tokens, G, args.lr)
        t0 = time.monotonic()
        train_sft(a, train_seqs, [], run / "sft_continued", sft_cfg)
        wall["sft_continued"], tokens["sft_continued"] = time.monotonic() - t0, sft_tokens
        push(server.url, a, "sft_continued")
        acceptance["sft_continued"] = evaluate(server.url, tok, args.eval_max_new_tokens, limit=args.eval_limit)
        print("sft_continued", json.dumps(acceptance["sft_continued"]), file=sys.stderr)

        # (b) SpecOPD: per step seqs x anchors x branches x G supervised branch tokens, one score_trees call
        b = copy.deepcopy(base)
        scfg = specopd_config(args.budget_tokens, G, anchors_per_seq=args.anchors, branches=args.branches,
                              seqs_per_step=args.seqs_per_step, lr=args.specopd_lr or args.lr,
                              temperature=args.temperature,
                              greedy_branch=args.greedy_branch, loss=args.loss,
                              reference_branch=args.reference_branch, root_anchors=args.root_anchors,
                              minibatches=args.minibatches, compute_dtype=args.compute_dtype)
        client.prefix_cache(clear=True)  # every tree-scoring arm starts with the server's prefix cache empty
        t0 = time.monotonic()
        summary = train_specopd(b, client, train_seqs, run / "specopd", scfg)
        wall["specopd"], tokens["specopd"] = time.monotonic() - t0, summary["supervised_tokens"]
        rows = [json.loads(line) for line in (run / "specopd" / "metrics.jsonl").read_text().splitlines()]
        acc_b = {"tokens": summary["supervised_tokens"], "scored_rows": sum(r["scored_rows"] for r in rows),
                 **{k: sum(r[k] for r in rows) for k in ("draft_s", "score_s", "loss_s")},
                 "prefix_cache": client.prefix_cache()}
        push(server.url, b, "specopd")
        acceptance["specopd"] = evaluate(server.url, tok, args.eval_max_new_tokens, limit=args.eval_limit)
        print("specopd", json.dumps(acceptance["specopd"]), file=sys.stderr)

        # (b') the same branch-parallel SpecOPD with another loss of the registry (comparison only; floors use (b))
        extra = {}
        for loss_name in args.extra_losses:
            name = f"specopd_{loss_name}"
            shutil.rmtree(run / name, ignore_errors=True)
            e = copy.deepcopy(base)
            client.prefix_cache(clear=True)
            t0 = time.monotonic()
            summary = train_specopd(e, client, train_seqs, run / name, specopd_config(
                args.budget_tokens, G, anchors_per_seq=args.anchors, branches=args.branches,
                seqs_per_step=args.seqs_per_step, lr=args.specopd_lr or args.lr, temperature=args.temperature,
                greedy_branch=args.greedy_branch, loss=loss_name,
                reference_branch=args.reference_branch if loss_name == "e2e_fkl_is" else 0.0,
                root_anchors=args.root_anchors if loss_name in ("e2e_fkl", "e2e_fkl_is") else 0,
                minibatches=args.minibatches, compute_dtype=args.compute_dtype))
            wall[name], tokens[name] = time.monotonic() - t0, summary["supervised_tokens"]
            push(server.url, e, name)
            acceptance[name] = evaluate(server.url, tok, args.eval_max_new_tokens, limit=args.eval_limit)
            extra[name] = e
            print(name, json.dumps(acceptance[name]), file=sys.stderr)

        # (c) sequential-rollout OPD: push, real rollouts through the SPECOPD worker, score the recorded blocks
        c = copy.deepcopy(base)
        acc_c = {"tokens": 0, "records": 0, "push_s": 0.0, "rollout_s": 0.0, "score_s": 0.0, "loss_s": 0.0,
                 "rollout_tokens": 0, "stopped_by_time": False}
        layer_ids = list(base.spec.target_layer_ids)

        def step_c(step, gen):
            if acc_c["tokens"] >= args.budget_tokens:
                raise _BudgetReached
            if args.sequential_max_minutes and time.monotonic() - t0 > 60 * args.sequential_max_minutes:
                acc_c["stopped_by_time"] = True  # its acceptance then reflects a smaller budget (reported)
                raise _BudgetReached
            t = time.monotonic()
            push(server.url, c, f"seq-opd-{step}")
            t1 = time.monotonic()
            idx = torch.randint(len(prompts), (args.rollout_prompts,), generator=gen).tolist()
            rollouts = collect_rollouts(client, [prompts[i] for i in idx], max_new_tokens=args.rollout_tokens,
                                        temperature=1.0, concurrency=args.rollout_prompts)
            t2 = time.monotonic()
            # keep exactly the remaining budget's records (the last step is trimmed, earlier steps use all)
            left = max(1, (args.budget_tokens - acc_c["tokens"]) // G)
            kept = []
            for r in rollouts:
                recs = [x for x in r.records if x["anchor"] < len(r.token_ids)][:left]
                left -= len(recs)
                kept.append(Rollout(r.token_ids, r.prompt_len, recs))
            loss, m = rollout_step(c, client, [r for r in kept if r.records], layer_ids, loss_name=args.loss)
            loss.backward()
            acc_c["push_s"] += t1 - t
            acc_c["rollout_s"] += t2 - t1
            acc_c["rollout_tokens"] += sum(len(r.token_ids) - r.prompt_len for r in rollouts)
            for k in ("score_s", "loss_s"):
                acc_c[k] += m[k]
            acc_c["tokens"] += m["supervised_tokens"]
            acc_c["records"] += m["records"]
            return loss.item(), {"est_tau": m["est_tau"], "supervised_tokens": acc_c["tokens"]}

        # steps: as many as the budget takes (the step that would exceed it is trimmed, then the loop stops);
        # the LR schedule assumes the expected count at tau ~ 1.2 tokens per verify
        steps_c = max(1, round(args.budget_tokens / (args.rollout_prompts * args.rollout_tokens / 1.2 * G)))
        client.prefix_cache(clear=True)
        t0 = time.monotonic()
        try:
            run_training(c, step_c, run / "sequential_opd", steps=10**4, lr=args.lr, warmup_steps=2,
                         min_lr_ratio=0.1, grad_clip=1.0, seed=0, log_every=1, ckpt_every=10**6,
                         desc="sequential OPD", schedule_steps=steps_c)
        except _BudgetReached:
            pass
        wall["sequential_opd"], tokens["sequential_opd"] = time.monotonic() - t0, acc_c["tokens"]
        acc_c["prefix_cache"] = client.prefix_cache()
        push(server.url, c, "sequential_opd")
        acceptance["sequential_opd"] = evaluate(server.url, tok, args.eval_max_new_tokens, limit=args.eval_limit)
        print("sequential_opd", json.dumps(acceptance["sequential_opd"]), file=sys.stderr)

    for name, d in (("sft_continued", a), ("specopd", b), ("sequential_opd", c), *extra.items()):
        d.save_pretrained(run / f"drafter-{name}", overwrite=True)
    # supervised tokens per second, three ways (all measured on the same machine, same server):
    #   end_to_end: whole training loop (supervision + drafter forward/backward + optimiser)
    #   collection: producing the target-scored supervision only (SpecOPD: drafter sampling forward + score call;
    #               sequential: push + rollouts + score call)
    #   target_side: seconds the target server worked for it (SpecOPD: score call; sequential: rollouts + score)
    coll_b, coll_c = acc_b["draft_s"] + acc_b["score_s"], acc_c["push_s"] + acc_c["rollout_s"] + acc_c["score_s"]
    tps = {
        "specopd": tokens["specopd"] / wall["specopd"],
        "sequential_opd": tokens["sequential_opd"] / wall["sequential_opd"],
    }
    tps_collect = {"specopd": tokens["specopd"] / coll_b, "sequential_opd": tokens["sequential_opd"] / coll_c}
    tps_target = {"specopd": tokens["specopd"] / acc_b["score_s"],
                  "sequential_opd": tokens["sequential_opd"] / (acc_c["rollout_s"] + acc_c["score_s"])}
    ratio = tps["specopd"] / tps["sequential_opd"]
    ratios = {"end_to_end": ratio, "collection": tps_collect["specopd"] / tps_collect["sequential_opd"],
              "target_side": tps_target["specopd"] / tps_target["sequential_opd"]}
    mean_gain = {t: acceptance["specopd"][t]["mean"] / acceptance["sft_continued"][t]["mean"] - 1 for t in ("T0", "T1")}
    payload = {
        "target": "SmolLM2-135M-Instruct", "start": str(sft_dir), "acceptance": acceptance,
        "references": {"dir": str(refs_dir), "split": "train", "offset": args.refs_offset,
                       "per_domain": args.refs_per_domain, "sequences": len(train_seqs),
                       "response_tokens": sum(len(x.token_ids) - x.prompt_len for x in train_seqs)},
        "supervised_tokens_per_s": tps, "throughput_ratio": ratio, "throughput_ratios": ratios,
        "supervised_tokens_per_s_collection": tps_collect, "supervised_tokens_per_s_target_side": tps_target,
        "budget_target_tokens": args.budget_tokens, "supervised_tokens": tokens, "wall_s": wall,
        "phases_s": {"specopd": acc_b, "sequential_opd": acc_c},
        "specopd_scored_rows_per_supervised_token": acc_b["scored_rows"] / max(1, acc_b["tokens"]),
        "specopd_gain_over_continued_sft": mean_gain,
        "specopd_config": scfg.model_dump(),
        "rollout": {"prompts": args.rollout_prompts, "tokens": args.rollout_tokens, "temperature": 1.0,
                    "concurrency": args.rollout_prompts, "loss": args.loss},
        "serving": {"draft_sampling": draft_sampling_mode()},
        "eval": {"limit_per_domain": args.eval_limit, "max_new_tokens": args.eval_max_new_tokens},
        "server": {"config": "cpu-smollm2", "cpu_threads": args.server_threads,
                   "prefix_cache_mb": cfg.score_trees_prefix_cache_mb},
        "floors": {"specopd_beats_continued_sft_T0": acceptance["specopd"]["T0"]["mean"] > acceptance["sft_continued"]["T0"]["mean"],
                   "specopd_beats_continued_sft_T1": acceptance["specopd"]["T1"]["mean"] > acceptance["sft_continued"]["T1"]["mean"],
                   "throughput_ratio_ge_10": ratio >= 10,
                   "collection_throughput_ratio_ge_10": ratios["collection"] >= 10},
    }
    write_result(args.out, payload, command="python " + " ".join(sys.argv))
    _plot(acceptance, tps, tps_collect, Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out}: throughput ratios {json.dumps({k: round(v, 2) for k, v in ratios.items()})}",
          file=sys.stderr)
    return 0


def _plot(acceptance: dict, tps: dict, tps_collect: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ["sft_start", "sft_continued", "specopd", *[m for m in acceptance if m.startswith("specopd_")],
               "sequential_opd"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, temp in zip(axes[:2], ("T0", "T1")):
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            ax.bar([x + (i - (len(methods) - 1) / 2) * width for x in range(len(DOMAINS))],
                   [acceptance[m][temp][d] for d in DOMAINS], width=width, label=m)
        ax.set_xticks(range(len(DOMAINS)), DOMAINS)
        ax.set_title(f"mean acceptance length (tau), {temp}")
        top = max(acceptance[m][temp][d] for m in methods for d in DOMAINS)
        ax.set_ylim(1.0, 1.0 + (top - 1.0) * 1.35)  # tau >= 1 always: start the axis there
    axes[0].legend(fontsize=7, ncol=2, loc="upper left")
    x = range(2)
    axes[2].bar([i - 0.2 for i in x], [tps["specopd"], tps["sequential_opd"]], width=0.4, label="end to end")
    axes[2].bar([i + 0.2 for i in x], [tps_collect["specopd"], tps_collect["sequential_opd"]], width=0.4,
                label="supervision collection")
    axes[2].set_xticks(list(x), ["SpecOPD", "sequential OPD"])
    axes[2].set_title("supervised tokens / s")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    from sglang_specopd.app.results import save_figure  # an earlier run's plot moves to history/

    save_figure(fig, path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
