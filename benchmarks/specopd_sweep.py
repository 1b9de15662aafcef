"""Choose SpecOPD / continued-SFT hyper-parameters on a VALIDATION prompt set, at the comparison's budget.

The comparison (``benchmarks/specopd_smollm2.py``) reports acceptance on the held-out EVAL split; picking its
settings there would select on the test set. This sweep starts one SPECOPD server with the SFT drafter, trains
each arm from that drafter with the same supervised-token budget, hot-swaps it in and measures mean acceptance
length at T=0 and T=1 on validation prompts: train-split prompts ``--val-offset ..`` per domain, which the SFT run
never used (it took the first ``--per-domain`` train-split prompts). Arms::

    sft:lr=5e-4                              continued SFT (8 sequences x 16 anchors per step)
    specopd:A=32,K=8,S=1,lr=5e-4,temp=1.0,greedy=1
                                             SpecOPD: anchors/seq, branches, seqs/step, LR, sampling temperature,
                                             branch 0 = the argmax block (1) or sampled (0), loss
                                             (e2e_tv by default; tv, fkl, rkl: the registry's tree losses), ref:
                                             lambda of the reference (T=0 path) branch (loss e2e_fkl_is), R:
                                             root anchors per sequence (slot 1 only; loss e2e_fkl(_is))

    python benchmarks/specopd_sweep.py --sft-run runs/sft_smollm2_big --arms sft:lr=5e-4 specopd:A=64,K=4,S=1
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
ADMIN_KEY = "specopd-sweep-admin"
SPECOPD_KEYS = {"A": "anchors_per_seq", "K": "branches", "S": "seqs_per_step", "lr": "lr", "temp": "temperature",
                "greedy": "greedy_branch", "loss": "loss", "ref": "reference_branch", "R": "root_anchors",
                "M": "minibatches", "dtype": "compute_dtype"}


def parse_arm(text: str) -> tuple[str, dict]:
    """``kind:key=value,...`` -> (kind, {key: number}); raises ValueError with the reason."""
    kind, _, rest = text.partition(":")
    if kind not in ("sft", "specopd"):
        raise ValueError(f"arm {text!r}: kind must be sft or specopd")
    params = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        allowed = ("lr",) if kind == "sft" else tuple(SPECOPD_KEYS)
        if key not in allowed:
            raise ValueError(f"arm {text!r}: unknown key {key!r} (valid: {', '.join(allowed)})")
        if key in ("loss", "dtype"):
            params[key] = value  # validated by SpecOPDConfig (a proposal-tree loss of the registry; a dtype)
        elif key == "greedy":
            params[key] = bool(int(value))
        else:
            params[key] = float(value) if key in ("lr", "temp", "ref") else int(value)
    return kind, params


def validation_records(offset: int, limit: int) -> dict:
    """Per domain, train-split prompts [offset, offset+limit): unseen by an SFT run that used the first ``offset``."""
    from specopd_trainer.pipeline import train_split_records

    return {d: train_split_records(offset, limit, [d]) for d in DOMAINS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-run", default="runs/sft_smollm2_big")
    ap.add_argument("--run-dir", default="runs/specopd_sweep")
    ap.add_argument("--out", default="benchmarks/results/specopd_sweep_smollm2_cpu.json")
    ap.add_argument("--arms", nargs="+", required=True)
    ap.add_argument("--refs-dir", default="runs/specopd_refs",
                    help="fresh target responses the arms train on (as in the comparison; collected once, cached)")
    ap.add_argument("--refs-offset", type=int, default=108)
    ap.add_argument("--refs-per-domain", type=int, default=60)
    ap.add_argument("--budget-tokens", type=int, default=57344)
    ap.add_argument("--val-offset", type=int, default=100)
    ap.add_argument("--val-limit", type=int, default=8)
    ap.add_argument("--eval-max-new-tokens", type=int, default=96)
    ap.add_argument("--eval-split", action="store_true",
                    help="measure on the held-out EVAL split (--val-limit prompts per domain) instead of validation "
                         "prompts: for reporting arms already chosen on validation, never for choosing them")
    ap.add_argument("--server-threads", type=int, default=2,
                    help="CPU server intra-op threads (the trainer waits while the server works, so both cores)")
    ap.add_argument("--port", type=int, default=31450)
    args = ap.parse_args(argv)
    arms = [parse_arm(a) for a in args.arms]
    if args.val_offset < args.refs_offset + args.refs_per_domain and args.refs_offset < args.val_offset + args.val_limit:
        ap.error(f"validation prompts [{args.val_offset}, {args.val_offset + args.val_limit}) overlap the training "
                 f"references [{args.refs_offset}, {args.refs_offset + args.refs_per_domain})")

    import torch
    from transformers import AutoTokenizer

    import specopd_smollm2 as comparison  # the comparison's arms and evaluation (this script's directory)
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.server.sampled_drafts import draft_sampling_mode
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.algorithms.sft.loop import train_sft
    from specopd_trainer.algorithms.specopd.loop import train_specopd
    from specopd_trainer.pipeline import push_drafter

    torch.set_num_threads(2)
    os.environ["SPECOPD_CPU_SERVER_THREADS"] = str(args.server_threads)  # read by launch.server_env on CPU
    sft_run, run = Path(args.sft_run), Path(args.run_dir)
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    sft_dir = sft_run / "drafter-sft"
    base = DFlashDrafter.from_pretrained(sft_dir, target)
    G = base.block_size - 1
    train_seqs = comparison.prepare_references(Path(args.refs_dir), tok, list(base.spec.target_layer_ids),
                                               offset=args.refs_offset, per_domain=args.refs_per_domain,
                                               max_new_tokens=160, port=args.port + 1)
    records = None if args.eval_split else validation_records(args.val_offset, args.val_limit)

    def evaluate(url):  # eval split: val_limit prompts per domain; else the validation records
        return comparison.evaluate(url, tok, args.eval_max_new_tokens, records=records,
                                   limit=args.val_limit if args.eval_split else None)

    spec = launch_spec(ServeConfig.load(config_path("cpu-smollm2")), port=args.port, drafter=str(sft_dir),
                       admin_api_key=ADMIN_KEY)
    results = []

    def save(start):  # after every arm: a run stopped early keeps the arms it finished
        payload = {"target": "SmolLM2-135M-Instruct", "start": str(sft_dir),
                   "budget_target_tokens": args.budget_tokens,
                   "references": {"dir": args.refs_dir, "offset": args.refs_offset,
                                  "per_domain": args.refs_per_domain, "sequences": len(train_seqs)},
                   "validation": {"split": "eval" if args.eval_split else "train",
                                  **({} if args.eval_split else {"offset": args.val_offset}),
                                  "limit_per_domain": args.val_limit, "max_new_tokens": args.eval_max_new_tokens},
                   "serving": {"draft_sampling": draft_sampling_mode()}, "sft_start": start, "arms": results,
                   "complete": len(results) == len(arms)}
        write_result(args.out, payload, command="python " + " ".join(sys.argv))

    with SGLangServer(spec) as server, SpecOPDClient(server.url) as client:
        start = evaluate(server.url)
        print("sft_start", json.dumps(start), file=sys.stderr)
        for i, ((kind, p), text) in enumerate(zip(arms, args.arms)):
            d = copy.deepcopy(base)
            out = run / f"arm{i}"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.monotonic()
            if kind == "sft":
                train_sft(d, train_seqs, [], out, comparison.continued_sft_config(args.budget_tokens, G,
                                                                                  p.get("lr", 5e-4))[0])
            else:
                kw = {"anchors_per_seq": 32, "branches": 8, "seqs_per_step": 1, "lr": 5e-4,
                      **{SPECOPD_KEYS[k]: v for k, v in p.items()}}
                train_specopd(d, client, train_seqs, out, comparison.specopd_config(args.budget_tokens, G, **kw))
            wall = time.monotonic() - t0
            push_drafter(server.url, d, f"arm{i}", ADMIN_KEY)
            acc = evaluate(server.url)
            gain = {t: acc[t]["mean"] / start[t]["mean"] - 1 for t in ("T0", "T1")}
            results.append({"arm": text, "kind": kind, "params": p, "train_wall_s": wall, "acceptance": acc,
                            "gain_over_start": gain})
            print(text, json.dumps({t: round(acc[t]["mean"], 4) for t in ("T0", "T1")}), f"{wall:.0f}s",
                  file=sys.stderr, flush=True)
            save(start)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
