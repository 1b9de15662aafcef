"""How well the SFT drafter fits its own training responses vs responses it never saw (first drafted slot).

For each set of target responses (the SFT run's training sequences, its held-out sequences, and optionally the
fresh references of the SpecOPD comparison) this samples ``--anchors`` anchors per sequence and compares the
drafter's first-slot distribution q_1 with the target's next-token distribution p_1 (the target run locally with
transformers, fp32, on the same tokens):

  alpha_1      = sum_v min(p_1, q_1)            (E2E-TV's per-slot acceptance, SpecOPD notes)
  argmax_agree = 1[argmax q_1 == argmax p_1]    (what T=0 verification accepts)
  p_argmax_q   = p_1(argmax q_1)                (what SGLang's target-only T>0 verification accepts on average)

    python benchmarks/sft_memorization.py [--sft-run runs/sft_smollm2_big] [--refs-dir runs/specopd_refs]

Writes ``benchmarks/results/sft_memorization_cpu.json`` (shared result shape).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def first_slot_fit(drafter, target_model, seqs, anchors_per_seq: int, seed: int = 0) -> dict:
    """Mean alpha_1 / argmax agreement / p(argmax q) over ``anchors_per_seq`` anchors of each sequence, plus how
    often the reference token is the target's greedy token (1.0 for greedy responses, up to bf16 serving noise)."""
    import torch

    from specopd_trainer.loops.common import sample_anchors

    gen = torch.Generator().manual_seed(seed)
    stats = {"alpha_1": [], "argmax_agree": [], "p_argmax_q": [], "reference_is_target_greedy": []}
    for s in seqs:
        anchors = sample_anchors(s.prompt_len, len(s.token_ids), anchors_per_seq, gen)
        with torch.no_grad():
            q = torch.softmax(drafter.logits(s.features.float(), s.token_ids, anchors)[0][:, 1].float(), -1)
            p = torch.softmax(target_model(s.token_ids[None]).logits[0, anchors].float(), -1)
        stats["alpha_1"].append(torch.minimum(p, q).sum(-1))
        stats["argmax_agree"].append((q.argmax(-1) == p.argmax(-1)).float())
        stats["p_argmax_q"].append(p.gather(1, q.argmax(-1, keepdim=True))[:, 0])
        stats["reference_is_target_greedy"].append((p.argmax(-1) == s.token_ids[anchors + 1]).float())
    out = {k: float(torch.cat(v).mean()) for k, v in stats.items()}
    out["sequences"], out["anchors"] = len(seqs), int(sum(x.numel() for x in stats["alpha_1"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-run", default="runs/sft_smollm2_big")
    ap.add_argument("--refs-dir", default="runs/specopd_refs", help="fresh references (skipped when absent)")
    ap.add_argument("--per-set", type=int, default=12, help="sequences per set")
    ap.add_argument("--anchors", type=int, default=16, help="anchors per sequence")
    ap.add_argument("--out", default="benchmarks/results/sft_memorization_cpu.json")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.features import FeatureStore
    from specopd_trainer.pipeline import split_holdout

    torch.set_num_threads(2)
    sft_run = Path(args.sft_run)
    target = prepare_model("smollm2")
    drafter = DFlashDrafter.from_pretrained(sft_run / "drafter-sft", target).eval()
    layers = list(drafter.spec.target_layer_ids)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    train, hold = split_holdout(FeatureStore(sft_run / "features", layers).load())
    sets = {"sft_training_responses": train[: args.per_set], "sft_held_out_responses": hold[: args.per_set]}
    if (Path(args.refs_dir) / "features").is_dir():
        sets["fresh_references"] = FeatureStore(Path(args.refs_dir) / "features", layers).load()[: args.per_set]
    fit = {}
    for name, seqs in sets.items():
        fit[name] = first_slot_fit(drafter, model, seqs, args.anchors)
        print(name, {k: round(v, 3) for k, v in fit[name].items()}, file=sys.stderr)
    write_result(args.out, {"drafter": str(sft_run / "drafter-sft"), "first_slot_fit": fit},
                 command="python " + " ".join(sys.argv))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
