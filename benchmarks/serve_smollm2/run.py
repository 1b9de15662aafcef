"""Serving check on the CPU default: plain vs SPECOPD on SmolLM2-135M-Instruct (real servers, real prompts).

For float32 (exact) and bfloat16 (fast) in turn, starts the plain server and the SPECOPD server (default
block-8 drafter) from ``server_configs/``, sends the same chat prompts greedily at concurrency 1 through
``/generate``, and records per prompt whether the SPECOPD tokens equal the plain tokens, the mean acceptance
length SGLang reports, time to healthy and output tokens/s. Greedy identity is asserted in float32 only: bf16
numerics change with batch shape even without speculation, so bf16 is reported as a match rate.

    python benchmarks/serve_smollm2/run.py [--out benchmarks/results/serve_smollm2_cpu.json] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

PROMPTS = [
    ("dialogue-1", "What are three good habits for staying healthy?"),
    ("dialogue-2", "Write a short, friendly email inviting a colleague to lunch on Friday."),
    ("coding-1", "Write a Python function that returns the n-th Fibonacci number."),
    ("coding-2", "Explain what a Python list comprehension is, with an example."),
    ("math-1", "A shop sells pencils at 3 for $1. How much do 12 pencils cost? Explain step by step."),
    ("agentic-1", "You can call the tool get_weather(city). The user asks: 'Is it raining in Paris?' "
                  "Reply with the tool call you would make as JSON."),
]


def _prefix_match(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_prompts(url: str, prompt_ids, max_new_tokens: int):
    """Send each prompt alone (concurrency 1); return per-prompt outputs and total wall seconds."""
    outs, total_s = [], 0.0
    with httpx.Client(timeout=600) as client:
        for ids in prompt_ids:
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                          "ignore_eos": True}}
            t0 = time.perf_counter()
            r = client.post(url + "/generate", json=body)
            total_s += time.perf_counter() - t0
            r.raise_for_status()
            d = r.json()
            outs.append({"output_ids": d["output_ids"], "meta": d["meta_info"]})
    return outs, total_s


def measure(dtype: str, prompt_ids, max_new_tokens: int, port: int):
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.serve.spec import config_path, launch_spec

    res = {}
    for kind, name in (("plain", "cpu-smollm2-plain"), ("specopd", "cpu-smollm2")):
        cfg = ServeConfig.load(config_path(name)).model_copy(update={"dtype": dtype})
        spec = launch_spec(cfg, port=port)
        print(f"[{dtype}] starting {kind} server ...", file=sys.stderr, flush=True)
        with SGLangServer(spec) as server:
            run_prompts(server.url, prompt_ids[:1], 8)  # warm-up
            outs, wall = run_prompts(server.url, prompt_ids, max_new_tokens)
            res[kind] = {"outs": outs, "wall_s": wall, "time_to_healthy_s": server.time_to_healthy_s}
        n_tok = sum(len(o["output_ids"]) for o in outs)
        print(f"[{dtype}] {kind}: {n_tok / wall:.1f} tok/s", file=sys.stderr, flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/serve_smollm2_cpu.json")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=31100)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from sglang_specopd.app.models import resolve_target
    from sglang_specopd.app.results import write_result

    tok = AutoTokenizer.from_pretrained(resolve_target("smollm2"))
    prompt_ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for _, p in PROMPTS]
    load_before = os.getloadavg()
    runs = {dt: measure(dt, prompt_ids, args.max_new_tokens, args.port) for dt in ("float32", "bfloat16")}
    load_after = os.getloadavg()

    def per_prompt(dt):
        plain, spec = runs[dt]["plain"]["outs"], runs[dt]["specopd"]["outs"]
        return [{"id": pid, "greedy_identical": a["output_ids"] == b["output_ids"],
                 "matching_prefix_tokens": _prefix_match(a["output_ids"], b["output_ids"]),
                 "new_tokens": len(b["output_ids"]), "acceptance_length": b["meta"].get("spec_accept_length"),
                 "verify_steps": b["meta"].get("spec_verify_ct")}
                for (pid, _), a, b in zip(PROMPTS, plain, spec)]

    def tps(dt, kind):
        r = runs[dt][kind]
        return sum(len(o["output_ids"]) for o in r["outs"]) / r["wall_s"]

    fp32, bf16 = per_prompt("float32"), per_prompt("bfloat16")
    spec_outs = runs["float32"]["specopd"]["outs"]
    total_tokens = sum(len(o["output_ids"]) for o in spec_outs)
    total_verify = sum(o["meta"].get("spec_verify_ct") or 0 for o in spec_outs)
    payload = {
        "target": "SmolLM2-135M-Instruct", "drafter": "default (random init, 2 layers, block 8)",
        "max_new_tokens": args.max_new_tokens, "concurrency": 1,
        "prompts": fp32,
        "greedy_identity_dtype": "float32",
        "all_greedy_identical_fp32": all(p["greedy_identical"] for p in fp32),
        "bf16_match_rate": sum(p["greedy_identical"] for p in bf16) / len(bf16),
        "bf16_prompts": bf16,
        "mean_acceptance_length": total_tokens / total_verify if total_verify else None,
        "time_to_healthy_s": runs["bfloat16"]["specopd"]["time_to_healthy_s"],
        "time_to_healthy_s_all": {dt: {k: runs[dt][k]["time_to_healthy_s"] for k in ("plain", "specopd")}
                                  for dt in runs},
        "tokens_per_s": {"plain": tps("bfloat16", "plain"), "specopd": tps("bfloat16", "specopd"),
                         "dtype": "bfloat16"},
        "tokens_per_s_fp32": {"plain": tps("float32", "plain"), "specopd": tps("float32", "specopd")},
        "load_average_1m": {"before": load_before[0], "after": load_after[0],
                            "note": "other jobs on the 2 cores slow both servers alike; compare plain vs specopd"},
    }
    path = write_result(args.out, payload, command="python " + " ".join(sys.argv))
    print(f"wrote {path}: fp32 identical {payload['all_greedy_identical_fp32']}, bf16 match rate "
          f"{payload['bf16_match_rate']:.2f}, tau {payload['mean_acceptance_length']:.2f}, tok/s "
          f"{payload['tokens_per_s']}")
    return 0 if payload["all_greedy_identical_fp32"] else 1


if __name__ == "__main__":
    sys.exit(main())
