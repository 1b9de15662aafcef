"""SFT baseline on the CPU default, end to end: data from a live server, training, export, serving, evaluation.

1. Prepare SmolLM2-135M-Instruct; make a fresh block-8, 2-layer DFlash drafter (the "init" drafter).
2. Start the plain target server (bf16, as served); regenerate target responses for the TRAIN split of the four
   domains (cached, resumable) and fetch the drafter's context features through ``/specopd/score_trees``.
3. Stop the server; train SFT for ``--minutes`` (checkpoints, resume); export the drafter in SGLang format.
4. Serve the init drafter, then the SFT drafter, with SPECOPD; measure mean acceptance length per domain on
   held-out prompts at T=0 and T=1 from SGLang's own per-request statistics.
5. Write ``benchmarks/results/sft_smollm2_cpu.json`` and a plot.

    python benchmarks/sft_smollm2/run.py [--minutes 30] [--per-domain 100] [--run-dir runs/sft_smollm2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DOMAINS = ["dialogue", "coding", "math", "agentic"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default="runs/sft_smollm2")
    ap.add_argument("--out", default="benchmarks/results/sft_smollm2_cpu.json")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--per-domain", type=int, default=100, help="training prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--eval-limit", type=int, default=6, help="held-out prompts per domain")
    ap.add_argument("--eval-max-new-tokens", type=int, default=96)
    ap.add_argument("--port", type=int, default=31300)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.wire.drafters.init import init_drafter
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.evaluate import evaluate_acceptance
    from specopd_trainer.loops.common import mean_walk_tau
    from specopd_trainer.algorithms.sft.config import SFTConfig
    from specopd_trainer.algorithms.sft.loop import train_sft
    from specopd_trainer.pipeline import prepare_sequences

    torch.set_num_threads(2)
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    init_dir = run / "drafter-init"
    if not (init_dir / "model.safetensors").is_file():
        init_drafter(target, init_dir, block_size=8, num_layers=2, seed=0, overwrite=True)
    drafter = DFlashDrafter.from_pretrained(init_dir, target)
    layer_ids = list(drafter.spec.target_layer_ids)
    timings = {}

    # 2. data from the live target server (train split only; cached, resumable)
    plain = ServeConfig.load(config_path("cpu-smollm2-plain"))
    t0 = time.monotonic()
    with SGLangServer(launch_spec(plain, port=args.port)) as server, SpecOPDClient(server.url) as client:
        train_seqs, holdout = prepare_sequences(client, tok, layer_ids, run, domains=DOMAINS,
                                                per_domain=args.per_domain, max_new_tokens=args.max_new_tokens)
    timings["collect_s"] = time.monotonic() - t0

    # 3. SFT
    train_tokens = sum(len(s.token_ids) - s.prompt_len for s in train_seqs)
    cfg = SFTConfig(steps=args.steps, max_minutes=args.minutes)
    init_walk = mean_walk_tau(drafter, holdout, 16)
    t0 = time.monotonic()
    summary = train_sft(drafter, train_seqs, holdout, run / "sft", cfg)
    timings["train_s"] = time.monotonic() - t0
    sft_dir = run / "drafter-sft"
    drafter.save_pretrained(sft_dir, overwrite=True)
    sft_walk = mean_walk_tau(drafter, holdout, 16)
    print(f"offline greedy-walk tau on held-out responses: init {init_walk:.3f} -> sft {sft_walk:.3f}", file=sys.stderr)

    # 4. serve + evaluate each drafter on held-out prompts
    spec_cfg = ServeConfig.load(config_path("cpu-smollm2"))
    acceptance = {}
    t0 = time.monotonic()
    for label, ddir in (("init", init_dir), ("sft", sft_dir)):
        acceptance[label] = {}
        with SGLangServer(launch_spec(spec_cfg, port=args.port, drafter=str(ddir))) as server:
            for temp, key in ((0.0, "T0"), (1.0, "T1")):
                res = evaluate_acceptance(server.url, tok, DOMAINS, temperature=temp, limit=args.eval_limit,
                                          max_new_tokens=args.eval_max_new_tokens, concurrency=8)
                acceptance[label][key] = {d: v["tau"] for d, v in res["per_domain"].items()}
                acceptance[label][key]["mean"] = res["mean_tau"]
                print(f"{label} {key}: {json.dumps(acceptance[label][key])}", file=sys.stderr)
    timings["eval_s"] = time.monotonic() - t0

    payload = {
        "target": "SmolLM2-135M-Instruct", "drafter": {"block_size": 8, "num_layers": 2, "target_layer_ids": layer_ids},
        "acceptance": acceptance, "train_tokens": train_tokens, "train_sequences": len(train_seqs),
        "wall_s": summary["wall_s"], "timings_s": timings, "sft": summary, "sft_config": cfg.model_dump(),
        "offline_walk_tau": {"init": init_walk, "sft": sft_walk},
        "drafter_dirs": {"init": str(init_dir), "sft": str(sft_dir)},
        "sft_beats_init_everywhere": all(acceptance["sft"][t][d] > acceptance["init"][t][d]
                                         for t in ("T0", "T1") for d in DOMAINS),
    }
    write_result(args.out, payload, command="python " + " ".join(sys.argv))
    _plot(acceptance, Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if payload["sft_beats_init_everywhere"] else 1


def _plot(acceptance: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, temp in zip(axes, ("T0", "T1")):
        xs = range(len(DOMAINS))
        for off, label in ((-0.2, "init"), (0.2, "sft")):
            ax.bar([x + off for x in xs], [acceptance[label][temp][d] for d in DOMAINS], width=0.4, label=label)
        ax.set_xticks(list(xs), DOMAINS)
        ax.set_title(f"mean acceptance length, {temp}")
        ax.axhline(1.0, color="grey", lw=0.8)
    axes[0].set_ylabel("tau (tokens / verify)")
    axes[0].legend()
    fig.tight_layout()
    from sglang_specopd.app.results import save_figure  # an earlier run's plot moves to history/

    save_figure(fig, path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
