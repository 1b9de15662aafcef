"""A/B of the batched CPU attention (server/cpu/batched_attention.py) on the CPU default, end to end.

Runs ``specopd bench serve --launch cpu-smollm2 --launch-baseline`` twice, with ``SPECOPD_CPU_BATCHED_ATTENTION=0``
(SGLang's one-SDPA-call-per-request loop) and ``=1`` (batched), at the same concurrency levels, prompts and
drafter, and writes ``benchmarks/results/cpu_attention_smollm2_cpu.json``: output tokens/s of plain and SPECOPD
serving per level for both settings and their ratio (batched / loop). Run it on a quiet machine.

    python benchmarks/cpu_attention/run.py [--concurrency 1,8,32] [--limit 8] [--max-new-tokens 64] [--drafter DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path("benchmarks/results/cpu_attention_smollm2_cpu.json")


def _run(switch: str, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "sglang_specopd.app.cli", "bench", "serve", "--launch", args.config,
           "--launch-baseline", "--concurrency", args.concurrency, "--limit", str(args.limit),
           "--max-new-tokens", str(args.max_new_tokens), "--temperature", "0", "--out", str(out)]
    if args.drafter:
        cmd += ["--drafter", args.drafter]
    env = {**os.environ, "SPECOPD_CPU_BATCHED_ATTENTION": switch}
    print(f"SPECOPD_CPU_BATCHED_ATTENTION={switch}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, env=env, check=True)
    return json.loads(out.read_text())


def _levels(result: dict) -> dict:
    out = {}
    for lv in result["levels"]:
        out[str(lv["concurrency"])] = {
            "plain_tokens_per_s": lv["baseline"]["output_tokens_per_s"],
            "specopd_tokens_per_s": lv["specopd"]["output_tokens_per_s"],
            "mean_acceptance_length": lv["specopd"].get("mean_acceptance_length"),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--limit", type=int, default=8, help="held-out prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    from sglang_specopd.app.results import write_result

    with tempfile.TemporaryDirectory() as tmp:
        loop = _levels(_run("0", args, Path(tmp) / "loop.json"))
        batched = _levels(_run("1", args, Path(tmp) / "batched.json"))
    ratio = {c: {k: batched[c][k] / loop[c][k] for k in ("plain_tokens_per_s", "specopd_tokens_per_s")}
             for c in loop}
    payload = {"config": args.config, "drafter": args.drafter, "limit_per_domain": args.limit,
               "max_new_tokens": args.max_new_tokens, "levels": {"loop": loop, "batched": batched},
               "speedup_batched_over_loop": ratio}
    write_result(args.out, payload, command="python " + " ".join(sys.argv))
    print(json.dumps(ratio, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
