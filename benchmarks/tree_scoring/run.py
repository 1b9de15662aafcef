"""Tree scoring throughput: ``/specopd/score_trees`` vs stock SGLang per-branch scoring, same server, same run.

For each case (anchors x branches x block size x prefix length) on SmolLM2-135M-Instruct: a reference of the
given length (the target's own greedy continuation of a chat prompt), random draft branches at evenly spaced
anchors, then
  * tree: one ``score_trees`` call (one target forward over [reference | all branches], top-20 log-probs);
  * baseline: stock SGLang at its best: ONE batched ``/generate`` call with every ``reference[:a+1] + branch``
    as its own sequence, ``max_new_tokens`` 1 (the last row's scores), radix cache on and warmed with the reference (shared prefixes are
    reused), log-probs only from the anchor row on (``logprob_start_len``), top-20.
Supervised tokens = anchors x branches x (block_size - 1) scored draft tokens. The exactness check compares the
top-1 log-prob of every scored row between the two paths (``max_abs_logprob_diff``, float32).

The roofline, in the same run and server: a plain prefill of ``tree_rows`` = prefix + nodes random tokens (the rows
one cold tree forward runs; ``/generate`` with ``max_new_tokens`` 1 after ``/flush_cache``, best of the repeats)
gives ``prefill_tokens_per_s``; the cold tree call (score_trees prefix cache cleared first, so the prefix is
computed) runs ``tree_rows / tree_s`` token-forwards/s, and ``roofline_fraction`` is their ratio. The tree call
also computes top-k log-probs over the vocabulary for every scored row (anchors + nodes), which the prefill does
for one row only: ``head_s`` times that LM head (the server's own ``scoring.head_outputs``: fp32 matmul,
logsumexp, top-k) here, in this process, with the target's real head shape and the server's thread count, and
``roofline_fraction_with_head`` = (prefill_s + head_s) / tree_s is the fraction of the roofline that includes it.
The warm call (``tree_warm_s``) reuses the prefix's K/V from the
score_trees prefix cache (``prefix_cache`` "hit"; hybrid GDN targets do not cache: "off"). The server scores each
reference as one forward (``--budget 0``) unless ``--budget`` cuts it into pieces of that many rows between decode
steps, as the serving configs do (docs/score_trees.md).

    python benchmarks/tree_scoring/run.py [--out benchmarks/results/tree_scoring_cpu.json] [--repeats 3]

``--target tiny-qwen3next`` (or a checkpoint directory) scores a hybrid Gated DeltaNet target instead (the
``cpu-smollm2-plain`` settings with that target, float32, a mamba state pool of ``--mamba-slots`` sequences for
the batched baseline); the result adds ``layer_pattern`` and ``state_bytes_per_node`` (one GDN layer's fp32
state, HV x Dv x Dk x 4: what a node holds while its depth level runs; layers run one at a time):

    python benchmarks/tree_scoring/run.py --target tiny-qwen3next --out benchmarks/results/tree_scoring_gdn_cpu.json

``--target tiny-qwen4exp-sparse`` scores the sparse-linear hybrid (Qwen4-Exp: GDN + QSA sparse attention, budget
32; radix cache off, as the QSA pool requires on CPU); each case adds ``groups_per_tree`` (the QSA selections the
tree forward computed per anchor tree, as the server reports them in the reply: one per scored trie node plus one per
depth of the rows that take every block; ``qsa_selections_per_tree`` per tree) beside
``sequential_selections_per_tree`` (the rows decoding each branch would select for), and
``qsa_min_topk_margin_per_tree`` (the server's smallest gap at a selection boundary per tree: where SGLang's own
prefill may select another block):

    python benchmarks/tree_scoring/run.py --target tiny-qwen4exp-sparse --out benchmarks/results/tree_scoring_qsa_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import httpx

CASES = [  # (anchors, branches, block_size, prefix_len)
    (16, 4, 8, 512),
    (8, 4, 8, 256),
    (16, 8, 8, 512),
    (32, 4, 8, 512),
]
TOP_K = 20


def make_reference(client, url, tok, length: int):
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a long, detailed essay about the history "
                                       "of computing, from the abacus to modern GPUs."}],
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": length - len(prompt), "temperature": 0,
                                                     "ignore_eos": True}}
    out = client.post(url + "/generate", json=body, timeout=1200).json()
    return (prompt + out["output_ids"])[:length]


ADMIN_KEY = "tree-scoring-bench"  # the benchmark's own server: clearing the prefix cache is an admin route
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def tree_call(client, url, ref, anchors, branches, block_size, cold: bool = True):
    """One ``score_trees`` call; ``cold``: the score_trees prefix cache is cleared first. Returns (seconds, tensors,
    the reply header's entry of the reference: ``prefix_cache`` state, and on a QSA target the selections the server
    computed per anchor tree and its smallest top-k margin)."""
    from sglang_specopd.wire.protocol import PREFIX_CACHE_PATH, decode_tensors

    if cold:
        client.post(url + PREFIX_CACHE_PATH + "/clear", headers=ADMIN).raise_for_status()
    req = {"references": [{"input_ids": ref, "trees": [{"anchor": a, "branches": brs} for a, brs in
                                                       zip(anchors, branches)]}],
           "block_size": block_size, "returns": ["topk"], "top_k": TOP_K}
    t0 = time.perf_counter()
    r = client.post(url + "/specopd/score_trees", json=req, timeout=1200)
    dt = time.perf_counter() - t0
    r.raise_for_status()
    tensors, header = decode_tensors(r.content)
    return dt, tensors, header["references"][0]


def prefill_call(client, url, length: int, vocab: int, rng) -> float:
    """Seconds for a plain prefill of ``length`` random tokens (radix cache flushed first, one output token)."""
    client.post(url + "/flush_cache", headers=ADMIN).raise_for_status()
    ids = [rng.randrange(vocab) for _ in range(length)]
    t0 = time.perf_counter()
    client.post(url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}},
                timeout=1200).raise_for_status()
    return time.perf_counter() - t0


def baseline_call(client, url, ref, anchors, branches):
    seqs, starts = [], []
    for a, brs in zip(anchors, branches):
        for br in brs:
            seqs.append(ref[: a + 1] + br)
            starts.append(a)
    # max_new_tokens 1: the last draft token's row comes back as the first output token's top log-probs.
    body = {"input_ids": seqs, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True, "logprob_start_len": starts, "top_logprobs_num": TOP_K}
    t0 = time.perf_counter()
    r = client.post(url + "/generate", json=body, timeout=1200)
    dt = time.perf_counter() - t0
    r.raise_for_status()
    return dt, r.json()


def exactness(tensors, base, anchors, branches) -> float:
    """Max |top-1 log-prob(tree) - top-1 log-prob(baseline)| over every scored row."""
    return max(exactness_per_tree(tensors, base, anchors, branches), default=0.0)


def exactness_per_tree(tensors, base, anchors, branches) -> list:
    """Per anchor tree, the max |top-1 log-prob(tree) - top-1 log-prob(baseline)| over its scored rows."""
    n_anchor = len(anchors)
    lp = tensors["ref0.topk_logprobs"]
    out, node, seq = [], 0, 0
    for ai, brs in enumerate(branches):
        worst = 0.0
        for br in brs:
            meta = base[seq]["meta_info"]
            # input_top_logprobs[0] is None (the anchor position itself); [1] is the anchor row (predicts draft
            # token 0); [j+2] is draft token j's row; the last draft token's row is output_top_logprobs[0].
            rows = meta["input_top_logprobs"][1:] + [meta["output_top_logprobs"][0]]
            worst = max(worst, abs(rows[0][0][0] - float(lp[ai][0])))
            for j in range(len(br)):
                worst = max(worst, abs(rows[j + 1][0][0] - float(lp[n_anchor + node + j][0])))
            node += len(br)
            seq += 1
        out.append(worst)
    return out


def head_seconds(rows: int, head_dims, threads: int, repeats: int = 3) -> float:
    """Best-of-``repeats`` seconds of the score_trees LM head (:func:`sglang_specopd.server.scoring.forward.head_outputs`,
    top-k returns, the server's own code) on ``rows`` random fp32 hidden rows (``head_dims`` = (hidden, vocab);
    torch at ``threads`` threads)."""
    import torch

    from sglang_specopd.server.scoring.forward import head_outputs
    from sglang_specopd.wire.protocol import ScoreTreesRequest

    hidden, vocab = head_dims
    req = ScoreTreesRequest(references=[{"input_ids": [0, 1], "trees": [{"anchor": 0, "branches": [[1]]}]}],
                            block_size=2, returns=["topk"], top_k=TOP_K)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        h, w = torch.randn(rows, hidden, generator=gen), torch.randn(vocab, hidden, generator=gen) * 0.02
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            head_outputs(h, w, req, torch.float32)
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        torch.set_num_threads(before)


def run_case(client, url, tok, vocab, case, refs_cache, repeats, rng, head_dims=None, threads=1, qsa=None):
    A, K, B, P = case
    if P not in refs_cache:
        refs_cache[P] = make_reference(client, url, tok, P)
    ref = refs_cache[P]
    anchors = [int(P * 0.2 + i * (P * 0.8 - 1) / A) for i in range(A)]
    branches = [[[rng.randrange(vocab) for _ in range(B - 1)] for _ in range(K)] for _ in anchors]
    tokens = A * K * (B - 1)
    rows = P + tokens  # one cold tree forward: the prefix, then every node
    tree_t, warm_t, base_t, prefill_t, states = [], [], [], [], set()
    for _ in range(repeats):
        prefill_t.append(prefill_call(client, url, rows, vocab, rng))
        dt, tensors, cold_ref = tree_call(client, url, ref, anchors, branches, B, cold=True)
        tree_t.append(dt)
        dt, warm_tensors, warm_ref = tree_call(client, url, ref, anchors, branches, B, cold=False)
        warm_t.append(dt)
        states.add(warm_ref.get("prefix_cache", "off"))
        # stock SGLang at its best: the reference's K/V already in the radix cache
        client.post(url + "/generate", json={"input_ids": ref, "sampling_params": {"max_new_tokens": 1}})
        dt, base = baseline_call(client, url, ref, anchors, branches)
        base_t.append(dt)
    tree_s, warm_s, base_s, prefill_s = min(tree_t), min(warm_t), min(base_t), min(prefill_t)
    res = {"anchors": A, "branches": K, "block_size": B, "prefix_len": P, "supervised_tokens": tokens,
           "tree_rows": rows, "tree_s": tree_s, "per_branch_s": base_s, "tree_tokens_per_s": tokens / tree_s,
           "per_branch_tokens_per_s": tokens / base_s, "ratio": base_s / tree_s,
           "prefill_s": prefill_s, "prefill_tokens_per_s": rows / prefill_s,
           "tree_token_forwards_per_s": rows / tree_s, "roofline_fraction": prefill_s / tree_s,
           "head_s": None, "roofline_fraction_with_head": None,
           "tree_warm_s": warm_s, "tree_warm_tokens_per_s": tokens / warm_s, "warm_ratio": base_s / warm_s,
           "prefix_cache": "/".join(sorted(states)),
           "max_abs_logprob_diff": max(exactness(tensors, base, anchors, branches),
                                       exactness(warm_tensors, base, anchors, branches)),
           "tree_s_all": tree_t, "tree_warm_s_all": warm_t, "per_branch_s_all": base_t, "prefill_s_all": prefill_t}
    if qsa:  # measured by the server (the selections its QSA layers computed), not derived here
        per_tree = cold_ref["qsa_selections_per_tree"]
        res["groups_per_tree"] = sum(per_tree) / len(per_tree)
        res["qsa_selections_per_tree"] = per_tree
        res["qsa_min_topk_margin_per_tree"] = cold_ref.get("qsa_min_topk_margin_per_tree")
        # beside each tree's margin: a difference far above the others sits in a tree with a small margin when a
        # near-tie block selection went the other way in SGLang's prefill (docs/sparse_attention.md, exactness)
        res["max_abs_logprob_diff_per_tree"] = exactness_per_tree(tensors, base, anchors, branches)
        res["sequential_selections_per_tree"] = sum(len(br) for brs in branches for br in brs) / len(branches)
    if head_dims:
        res["head_s"] = head_seconds(A + tokens, head_dims, threads)
        res["roofline_fraction_with_head"] = (prefill_s + res["head_s"]) / tree_s
    print(f"case {case}: tree {res['tree_tokens_per_s']:.0f} tok/s (warm {res['tree_warm_tokens_per_s']:.0f}), "
          f"per-branch {res['per_branch_tokens_per_s']:.0f} tok/s, ratio {res['ratio']:.1f}x, roofline fraction "
          f"{res['roofline_fraction']:.2f} (prefill {res['prefill_tokens_per_s']:.0f} tok/s; with the LM head "
          f"{res['roofline_fraction_with_head'] or float('nan'):.2f}), "
          f"max |dlogp| {res['max_abs_logprob_diff']:.2e}", file=sys.stderr)
    return res


def parse_cases(text: str):
    """``"A,K,B,P;A,K,B,P"`` -> [(anchors, branches, block_size, prefix_len), ...]. Raises ValueError."""
    cases = [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip()]
    if not cases or any(len(c) != 4 or min(c) < 1 for c in cases):
        raise ValueError(f"--cases wants 'A,K,B,P;...' with positive ints, got {text!r}")
    return cases


def text_config(target_dir) -> dict:
    """The checkpoint's text config (the nested ``text_config`` of a multimodal-layout config, e.g. Qwen4-Exp)."""
    from pathlib import Path

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    return cfg.get("text_config", cfg)


def hybrid_info(target_dir) -> dict:
    """For a hybrid Gated DeltaNet checkpoint: ``layer_pattern`` (e.g. "3 GDN : 1 full attention x 2"),
    ``gdn_layers`` and ``state_bytes_per_node`` (fp32 HV x Dv x Dk x 4 of one GDN layer); with a QSA indexer
    (Qwen4-Exp) also ``qsa_layers``, ``qsa_budget`` and ``qsa_compress_ratio``; {} for other targets."""
    cfg = text_config(target_dir)
    types = cfg.get("layer_types") or []
    gdn = sum(t == "linear_attention" for t in types)
    if not gdn:
        return {}
    full = len(types) - gdn
    state = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"] * cfg["linear_key_head_dim"] * 4
    pattern = ",".join(t[0] for t in types)  # l = linear attention (GDN), f = full attention
    info = {"layer_pattern": f"{len(types)} layers: {gdn} GDN + {full} full attention ({pattern})",
            "gdn_layers": gdn, "state_bytes_per_node": state}
    if cfg.get("indexer_n_heads"):
        info["layer_pattern"] = info["layer_pattern"].replace("full attention", "QSA sparse attention")
        info.update(qsa_layers=full, qsa_budget=int(cfg["indexer_budget"]),
                    qsa_compress_ratio=int(cfg["indexer_compress_ratio"]))
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/tree_scoring_cpu.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=31200)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--target", default="smollm2", help="smollm2 (default), tiny-qwen3next, or a checkpoint dir")
    ap.add_argument("--cases", default=None, help="'A,K,B,P;...' (anchors, branches, block, prefix) instead of "
                                                  "the default four cases (e.g. a smoke run)")
    ap.add_argument("--mamba-slots", type=int, default=160, help="hybrid targets: SGLang's mamba state pool size")
    ap.add_argument("--budget", type=int, default=0, help="score_trees_budget_tokens of the server (0: each "
                                                          "reference in one forward)")
    ap.add_argument("--prefix-cache-mb", type=int, default=1024, help="score_trees prefix cache of the server")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import resolve_target
    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.spec import config_path, launch_spec

    target_dir = resolve_target(args.target)
    hybrid = hybrid_info(target_dir)
    tok = AutoTokenizer.from_pretrained(target_dir)
    cfg = ServeConfig.load(config_path("cpu-smollm2-plain")).model_copy(update={
        "dtype": args.dtype, "target": str(target_dir), "score_trees_budget_tokens": args.budget,
        "score_trees_prefix_cache_mb": args.prefix_cache_mb})
    extra = ["--max-mamba-cache-size", str(args.mamba_slots)] if hybrid else []
    qsa = (hybrid["qsa_budget"], hybrid["qsa_compress_ratio"]) if "qsa_budget" in hybrid else None
    if qsa:  # the QSA pool needs page size 64, the mamba radix cache 1 (docs/cpu_adaptations.md, adaptation 13)
        extra.append("--disable-radix-cache")
    target_cfg = text_config(target_dir)
    head_dims = (int(target_cfg["hidden_size"]), int(target_cfg["vocab_size"]))
    threads = int(os.environ.get("SPECOPD_CPU_SERVER_THREADS") or os.environ.get("OMP_NUM_THREADS") or 1)
    rng = random.Random(0)
    with SGLangServer(launch_spec(cfg, port=args.port, admin_api_key=ADMIN_KEY, extra_args=extra)) as server, \
            httpx.Client(timeout=1800) as client:
        refs = {}
        cases = [run_case(client, server.url, tok, len(tok), c, refs, args.repeats, rng, head_dims, threads, qsa)
                 for c in (parse_cases(args.cases) if args.cases else CASES)]
    ok = all(c["max_abs_logprob_diff"] <= args.tolerance for c in cases)
    name = "SmolLM2-135M-Instruct" if args.target == "smollm2" else args.target
    write_result(args.out, {"target": name, **hybrid, "dtype": args.dtype, "top_k": TOP_K,
                            "score_trees_budget_tokens": args.budget,
                            "score_trees_prefix_cache_mb": args.prefix_cache_mb,
                            "min_roofline_fraction": min(c["roofline_fraction"] for c in cases),
                            "min_roofline_fraction_with_head": min(c["roofline_fraction_with_head"] for c in cases),
                            **({"groups_per_tree": [c["groups_per_tree"] for c in cases]} if qsa else {}),
                            "server_threads": threads,
                            "exactness_tolerance": args.tolerance, "exactness_ok": ok, "cases": cases},
                 command="python " + " ".join(sys.argv))
    print(f"wrote {args.out}; exactness {'ok' if ok else 'FAILED'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
