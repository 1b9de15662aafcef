"""Which dtype serves fastest on this CPU: float32 vs bf16 for the SmolLM2-135M target (what ``dtype: auto`` decides).

Without native bf16 arithmetic (``avx512_bf16`` / ``amx_bf16``) oneDNN emulates bf16 matmuls; this measures how
much that costs, two ways, at 1 and 2 torch threads, medians of ``--repeats`` timed calls after a warm-up:

* ``linear``: one [rows x 576] x [576 x 1536] ``F.linear`` (SmolLM2's MLP up-projection shape), GFLOP/s;
* ``prefill``: the real SmolLM2 (transformers ``AutoModelForCausalLM``, eager attention) on ``--tokens`` random
  tokens in one forward, tokens/s (the server's prefill work without SGLang).

Writes ``benchmarks/results/cpu_dtype_cpu.json`` with ``machine.cpu_simd`` / ``machine.cpu_native_bf16`` (the
earlier file moves to history/, as results from different CPUs are not comparable) and ``auto_dtype``, what
:func:`sglang_specopd.app.cpu_dtype.resolve_dtype` picks here. Run it on a quiet machine:

    python benchmarks/cpu_dtype.py [--tokens 512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "cpu_dtype_cpu.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up (oneDNN primitive creation)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def linear_gflops(dtype: torch.dtype, rows: int, repeats: int) -> float:
    """GFLOP/s of ``F.linear`` [rows, 576] x [1536, 576]^T in ``dtype``."""
    x = torch.randn(rows, 576, dtype=dtype)
    w = torch.randn(1536, 576, dtype=dtype)
    s = _median_s(lambda: torch.nn.functional.linear(x, w), repeats)
    return 2 * rows * 576 * 1536 / s / 1e9


def prefill_tokens_per_s(model_dir: Path, dtype: torch.dtype, tokens: int, repeats: int) -> float:
    """Tokens/s of one no-grad forward of the target on ``tokens`` random ids (batch 1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").eval()
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        s = _median_s(lambda: model(input_ids=ids, logits_to_keep=1), repeats)
    return tokens / s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rows", type=int, default=2048, help="rows of the linear microbenchmark")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    from sglang_specopd.app.cpu_dtype import cpu_has_native_bf16, resolve_dtype
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result

    target = prepare_model("smollm2")
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name, dt in DTYPES.items():
            row = {"threads": threads, "dtype": name,
                   "linear_gflops": round(linear_gflops(dt, args.rows, args.repeats), 2),
                   "prefill_tokens_per_s": round(prefill_tokens_per_s(target, dt, args.tokens, args.repeats), 1)}
            rows.append(row)
            print(row, file=sys.stderr)
    best = {t: max((r for r in rows if r["threads"] == t), key=lambda r: r["prefill_tokens_per_s"])["dtype"]
            for t in {r["threads"] for r in rows}}
    ratio = {t: round(next(r["prefill_tokens_per_s"] for r in rows if r["threads"] == t and r["dtype"] == "float32")
                      / next(r["prefill_tokens_per_s"] for r in rows if r["threads"] == t and r["dtype"] == "bfloat16"),
                      2) for t in best}
    payload = {"target": "SmolLM2-135M-Instruct", "tokens": args.tokens, "linear_rows": args.rows,
               "repeats": args.repeats, "rows": rows, "fastest_dtype_by_threads": {str(k): v for k, v in best.items()},
               "float32_over_bfloat16_prefill": {str(k): v for k, v in ratio.items()},
               "native_bf16": cpu_has_native_bf16(), "auto_dtype": resolve_dtype("cpu", "auto")}
    write_result(args.out, payload, command="python " + " ".join(["benchmarks/cpu_dtype.py"] + list(argv or sys.argv[1:])))
    print(f"auto picks {payload['auto_dtype']}; fastest {payload['fastest_dtype_by_threads']}; "
          f"fp32/bf16 prefill {ratio}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
