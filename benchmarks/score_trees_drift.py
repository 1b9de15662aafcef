"""Does ``/specopd/score_trees`` slow down over a server's lifetime? The same requests, repeated on one server.

Starts one SPECOPD server (SmolLM2, bf16, the comparison's config) and sends ``--blocks`` x ``--calls`` SpecOPD
scoring requests (the comparison's recipe: 2 references x (8 anchors x 7 branches + 64 root anchors); block b
repeats exactly the requests of block 0). Per block it records the mean seconds per call, a trainer-side matmul
probe (10 x [2000, 2000] fp32 matmuls: how fast the machine itself is right then) and the scheduler's RSS. If the
server's time grows faster than the probe, the slowdown is the server's, not the machine's::

    python benchmarks/score_trees_drift.py --blocks 6 --calls 15

Writes ``benchmarks/results/score_trees_drift_cpu.json``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def scheduler_rss_mb() -> int:
    """RSS of the (first) ``sglang::scheduler`` process in MB, -1 when none is found."""
    out = subprocess.run(["ps", "-eo", "rss,args"], capture_output=True, text=True).stdout.splitlines()
    rows = [line.split(None, 1) for line in out if "sglang::scheduler" in line]
    return int(rows[0][0]) // 1024 if rows else -1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--calls", type=int, default=15, help="requests per block (the same ones in every block)")
    ap.add_argument("--sft-run", default="runs/sft_smollm2_big")
    ap.add_argument("--refs-dir", default="runs/specopd_refs")
    ap.add_argument("--out", default="benchmarks/results/score_trees_drift_cpu.json")
    ap.add_argument("--server-threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=31490)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import specopd_smollm2 as comparison

    import torch
    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.batch import sample_and_score

    torch.set_num_threads(2)
    os.environ["SPECOPD_CPU_SERVER_THREADS"] = str(args.server_threads)
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    sft_dir = Path(args.sft_run) / "drafter-sft"
    drafter = DFlashDrafter.from_pretrained(sft_dir, target)
    seqs = comparison.prepare_references(Path(args.refs_dir), tok, list(drafter.spec.target_layer_ids), offset=108,
                                         per_domain=60, max_new_tokens=160, port=args.port + 1)
    cfg = SpecOPDConfig(anchors_per_seq=8, root_anchors_per_seq=64, branches=7, loss="e2e_fkl_is")
    probe_x = torch.randn(2000, 2000)
    blocks = []
    spec = launch_spec(ServeConfig.load(config_path("cpu-smollm2")), port=args.port, drafter=str(sft_dir))
    with SGLangServer(spec) as server, SpecOPDClient(server.url) as client:
        for b in range(args.blocks):
            secs = []
            for i in range(args.calls):
                gen = torch.Generator().manual_seed(i)  # the same requests in every block
                picks = torch.randint(len(seqs), (2,), generator=gen).tolist()
                with torch.no_grad():
                    secs.append(sample_and_score(drafter, client, [seqs[j] for j in picks], cfg, gen).score_s)
            t0 = time.perf_counter()
            for _ in range(10):
                probe_x @ probe_x
            row = {"block": b, "score_s_per_call": sum(secs) / len(secs), "matmul_probe_s": time.perf_counter() - t0,
                   "scheduler_rss_mb": scheduler_rss_mb()}
            blocks.append(row)
            print(row, file=sys.stderr, flush=True)
    first, last = blocks[0], blocks[-1]
    payload = {"target": "SmolLM2-135M-Instruct", "server": {"config": "cpu-smollm2", "cpu_threads": args.server_threads},
               "calls_per_block": args.calls, "blocks": blocks,
               "score_growth": last["score_s_per_call"] / first["score_s_per_call"] - 1,
               "probe_growth": last["matmul_probe_s"] / first["matmul_probe_s"] - 1}
    write_result(args.out, payload)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
