"""SpecOPD supervised-token throughput per setting (no acceptance evaluation): where a step's time goes.

Starts one SPECOPD server (SmolLM2, bf16) with the SFT drafter and, for every setting, runs ``--steps`` SpecOPD
steps from that drafter on the comparison's fresh references, recording supervised tokens/s over the whole loop
(server calls, drafter forward/backward and optimizer included, as the comparison measures it), distinct scored
rows per supervised token and the per-phase seconds (drafting, scoring, loss; the rest is backward + optimizer).
Settings use the sweep's keys (``A`` anchors/seq, ``K`` branches, ``S`` seqs/step, ``R`` root anchors/seq,
``M`` minibatches per scored batch, ``dtype`` the drafter's compute dtype, ``loss``)::

    python benchmarks/specopd_throughput/run.py --settings A=8,K=7,S=2,R=64 A=32,K=16,S=1 --steps 24

Compare the tokens/s with the sequential-rollout OPD arm of ``specopd_smollm2_cpu.json`` measured on the same
machine (10x is the comparison's floor). Writes ``benchmarks/results/specopd_throughput_smollm2_cpu.json``.
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

ADMIN_KEY = "specopd-throughput-admin"

SPECOPD_KEYS = {"A": "anchors_per_seq", "K": "branches", "S": "seqs_per_step", "lr": "lr", "temp": "temperature",
                "greedy": "greedy_branch", "loss": "loss", "ref": "reference_branch", "R": "root_anchors",
                "M": "minibatches", "dtype": "compute_dtype"}


def parse_arm(text: str) -> tuple[str, dict]:
    """``kind:key=value,...`` -> (kind, {key: number}); raises ValueError with the reason (the setting syntax of
    the removed one-off ``specopd_sweep.py``, kept for ``--settings``)."""
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", required=True, help="sweep-style keys, e.g. A=32,K=16,S=1,R=0")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--sft-run", default="runs/sft_smollm2_big")
    ap.add_argument("--run-dir", default="runs/specopd_throughput")
    ap.add_argument("--refs-dir", default="runs/specopd_refs")
    ap.add_argument("--refs-offset", type=int, default=108)
    ap.add_argument("--refs-per-domain", type=int, default=60)
    ap.add_argument("--out", default="benchmarks/results/specopd_throughput_smollm2_cpu.json")
    ap.add_argument("--server-threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=31470)
    ap.add_argument("--prefix-cache-mb", type=int, default=None,
                    help="the server's score_trees prefix cache (default: the cpu-smollm2 config's; 0 = off); "
                         "it is emptied before every setting, so each starts cold")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the comparison, specopd_smollm2/
    from specopd_smollm2 import run as comparison

    settings = []
    for text in args.settings:
        _, params = parse_arm("specopd:" + text)
        settings.append((text, {SPECOPD_KEYS[k]: v for k, v in params.items()}))

    import torch
    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.algorithms.specopd.loop import train_specopd

    torch.set_num_threads(2)
    os.environ["SPECOPD_CPU_SERVER_THREADS"] = str(args.server_threads)
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    sft_dir = Path(args.sft_run) / "drafter-sft"
    base = DFlashDrafter.from_pretrained(sft_dir, target)
    g = base.block_size - 1
    train_seqs = comparison.prepare_references(Path(args.refs_dir), tok, list(base.spec.target_layer_ids),
                                               offset=args.refs_offset, per_domain=args.refs_per_domain,
                                               max_new_tokens=160, port=args.port + 1)
    serve_cfg = ServeConfig.load(config_path("cpu-smollm2"))
    if args.prefix_cache_mb is not None:
        serve_cfg = serve_cfg.model_copy(update={"score_trees_prefix_cache_mb": args.prefix_cache_mb})
    spec = launch_spec(serve_cfg, port=args.port, drafter=str(sft_dir), admin_api_key=ADMIN_KEY)
    results = []
    with SGLangServer(spec) as server, SpecOPDClient(server.url, admin_api_key=ADMIN_KEY) as client:
        for i, (text, kw) in enumerate(settings):
            client.prefix_cache(clear=True)
            kw = {"anchors_per_seq": 16, "branches": 8, "seqs_per_step": 1, "lr": 1e-3, "loss": "e2e_fkl_is", **kw}
            cfg = comparison.specopd_config(10**9, g, **kw)
            cfg = cfg.model_copy(update={"steps": -(-args.steps // cfg.minibatches) * cfg.minibatches})
            out = Path(args.run_dir) / f"setting{i}"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.monotonic()
            summary = train_specopd(copy.deepcopy(base), client, train_seqs, out, cfg)
            wall = time.monotonic() - t0
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            phases = {k: sum(r[k] for r in rows) for k in ("draft_s", "score_s", "loss_s")}
            loop_s = summary["supervised_tokens"] / summary["supervised_tokens_per_s"]
            entry = {"setting": text, "config": {k: cfg.model_dump()[k] for k in (
                         "anchors_per_seq", "branches", "seqs_per_step", "root_anchors_per_seq", "loss", "minibatches",
                         "compute_dtype")},
                     "steps": len(rows), "supervised_tokens": summary["supervised_tokens"],
                     "supervised_tokens_per_step": summary["supervised_tokens"] / len(rows),
                     "supervised_tokens_per_s": summary["supervised_tokens_per_s"],
                     "scored_rows_per_supervised_token": sum(r["scored_rows"] for r in rows)
                                                         / summary["supervised_tokens"],
                     "phases_s": {**phases, "backward_optimizer_other_s": loop_s - sum(phases.values())},
                     "prefix_cache": client.prefix_cache(),
                     "wall_s": wall}
            results.append(entry)
            print(text, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in entry.items()
                                    if k in ("supervised_tokens_per_s", "scored_rows_per_supervised_token")}),
                  file=sys.stderr)
    payload = {"target": "SmolLM2-135M-Instruct", "start": str(sft_dir), "steps_per_setting": args.steps,
               "server": {"config": "cpu-smollm2", "cpu_threads": args.server_threads,
                          "prefix_cache_mb": serve_cfg.score_trees_prefix_cache_mb}, "settings": results}
    write_result(args.out, payload, command="python " + " ".join(sys.argv))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
