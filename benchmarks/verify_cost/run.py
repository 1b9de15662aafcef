"""Why speculative decoding loses to plain serving on this CPU: what a verify forward of ``m`` tokens costs against
a decode forward of one, for the SmolLM2-135M target (float32, one thread: the CPU server's defaults).

Speculative decoding pays off when a verify forward over the block (``block_size`` tokens) costs about one decode
forward, as on a GPU, where both are bound by reading the weights. On a CPU without native bf16 the float32
matmuls of a few rows are compute-bound instead: MKL's GEMM at ``m = 8`` rows takes several times its GEMV at
``m = 1``. This measures, medians of ``--repeats`` timed calls after a warm-up, at ``m`` in ``--rows``:

* ``forward_ms``: the real target (transformers ``AutoModelForCausalLM``, eager attention) forwarding ``m`` new
  tokens after a ``--prefix``-token KV cache, logits at every new position (what verify needs; decode is m = 1);
* ``linear_ms``: every decoder-layer projection (q, k, v, o, gate, up, down of all layers, the real weights in
  layer order, so they stream from memory as in a forward) on ``m`` rows;
* ``lm_head_ms``: the tied output head [vocab x hidden] on ``m`` rows (the target's verify logits; the DFlash
  drafter runs the same head on its ``block_size - 1`` draft slots).

With ``--served`` (default: the committed ``concurrency_reference_smollm2_cpu.json``) it also derives, at
concurrency 1, what one served SPECOPD step cost in plain decode steps (``tau x plain tok/s / speculative tok/s``):
the acceptance length at which speculative decoding would break even on this machine. Writes
``benchmarks/results/verify_cost_smollm2_cpu.json``. Run it on a quiet machine (a few minutes):

    python benchmarks/verify_cost/run.py [--prefix 256] [--rows 1,2,4,8,16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "verify_cost_smollm2_cpu.json"
SERVED = ROOT / "benchmarks" / "results" / "concurrency_reference_smollm2_cpu.json"


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up (MKL / oneDNN primitive creation)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def forward_ms(model, prefix: int, m: int, repeats: int) -> float:
    """Milliseconds of one no-grad forward of ``m`` new tokens after a ``prefix``-token KV cache (batch 1), logits at
    all ``m`` positions; the cache is cropped back to ``prefix`` after every call."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(m)
    vocab = model.config.vocab_size
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.randint(0, vocab, (1, prefix), generator=g), past_key_values=cache, use_cache=True)
        ids = torch.randint(0, vocab, (1, m), generator=g)
        pos = torch.arange(prefix, prefix + m)[None]

        def step():
            model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
            cache.crop(-m)

        return _median_ms(step, repeats)


def linear_ms(model, m: int, repeats: int) -> float:
    """Milliseconds of every decoder-layer projection of ``model`` on ``m`` rows, in layer order."""
    weights = [mod.weight for layer in model.model.layers for mod in layer.modules()
               if isinstance(mod, torch.nn.Linear)]
    x = {w.shape[1]: torch.randn(m, w.shape[1]) for w in weights}

    def run():
        for w in weights:
            torch.nn.functional.linear(x[w.shape[1]], w)

    return _median_ms(run, repeats)


def lm_head_ms(model, m: int, repeats: int) -> float:
    """Milliseconds of the output head on ``m`` rows."""
    w = model.get_output_embeddings().weight
    x = torch.randn(m, w.shape[1])
    return _median_ms(lambda: torch.nn.functional.linear(x, w), repeats)


def served_break_even(path: Path) -> dict | None:
    """From a concurrency_reference result: at T=0, concurrency 1, the SPECOPD step's cost in plain decode steps
    (= the acceptance length at which speculative decoding breaks even), or None without the file."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    row = next(r for r in data["temperatures"]["T0"] if r["concurrency"] == 1)
    tau = row["acceptance"]["mean"]
    cost = tau * row["plain_tokens_per_s"] / row["specopd_tokens_per_s"]
    name = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
    return {"file": name, "git_commit": data.get("git_commit"), "concurrency": 1,
            "tau": round(tau, 3), "plain_tokens_per_s": round(row["plain_tokens_per_s"], 2),
            "specopd_tokens_per_s": round(row["specopd_tokens_per_s"], 2),
            "step_cost_in_plain_steps": round(cost, 2), "break_even_tau": round(cost, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=256, help="KV-cache tokens before the new ones")
    ap.add_argument("--rows", default="1,2,4,8,16", help="new tokens per forward (1 = decode; 8 = a block-8 verify)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the CPU server's default is 1)")
    ap.add_argument("--served", default=str(SERVED), help="concurrency_reference result to derive break-even from")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    if args.prefix < 1 or args.repeats < 1 or not rows or min(rows) < 1 or 1 not in rows:
        ap.error("--prefix and --repeats must be >= 1 and --rows must include 1 (the decode baseline)")
    from transformers import AutoModelForCausalLM

    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(prepare_model("smollm2"), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    table = []
    for m in rows:
        row = {"m": m, "forward_ms": round(forward_ms(model, args.prefix, m, args.repeats), 2),
               "linear_ms": round(linear_ms(model, m, args.repeats), 2),
               "lm_head_ms": round(lm_head_ms(model, m, args.repeats), 2)}
        table.append(row)
        print(row, file=sys.stderr)
    base = next(r for r in table if r["m"] == 1)
    for row in table:
        for key in ("forward_ms", "linear_ms", "lm_head_ms"):
            row[key.replace("_ms", "_over_decode")] = round(row[key] / base[key], 2)
    served = served_break_even(Path(args.served))
    payload = {"target": "SmolLM2-135M-Instruct", "dtype": "float32", "threads": args.threads,
               "prefix_tokens": args.prefix, "repeats": args.repeats, "rows": table, "served": served}
    write_result(args.out, payload, command="python " + " ".join(["benchmarks/verify_cost/run.py"] + list(argv or sys.argv[1:])))
    eight = next((r for r in table if r["m"] == 8), None)
    if eight:
        print(f"a block-8 verify forward costs {eight['forward_over_decode']}x a decode forward "
              f"(linears {eight['linear_over_decode']}x, head {eight['lm_head_over_decode']}x)", file=sys.stderr)
    if served:
        print(f"served step at concurrency 1 = {served['step_cost_in_plain_steps']} plain steps: break-even tau "
              f"{served['break_even_tau']} (measured tau {served['tau']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
