"""The GPU acceptance run of every kernel: values (and gradients where trained) vs the reference, timed, verified.

One command on a GPU machine (torch + Triton; FlashInfer if it imports; no SGLang), from the repo root:

    python benchmarks/kernels_gpu/run.py --all

(``specopd_kernels`` is imported from ``kernels/`` in the source tree when it is not installed). Sections
(``--only`` picks some; budget: under 8 minutes on one H200 for the full grid, each section's wall time is
recorded in ``section_wall_s``), each case checked against the plain-torch reference and timed (CUDA
synchronised, median of ``--repeats``):
  - ``alpha``: the fused Triton E2E-TV alpha ``fused_acceptance_alpha`` vs ``acceptance_alpha`` on [rows, V]
    logits, V in {49152, 151936}, fp32 / bf16, values and gradients;
  - ``tree_alpha``: proposal-tree alpha (SpecOPD's loss path): row-chunked torch and Triton vs
    ``tree_alpha_reference``, values and gradients;
  - ``tree_attention``: tree attention on SpecOPD-shaped trees (full rows and cached-prefix node rows):
    ``tree_attention_grouped`` (torch), the Triton kernel ``tree_attention_triton`` and FlashInfer's packed custom
    mask (when flashinfer imports) vs ``tree_attention_reference`` (dense [T, T] mask, fp32 math; the grouped path
    where that does not fit), timed against each other and a dense-mask SDPA;
  - ``tree_losses``: the SpecOPD tree losses E2E-KL and E2E-KL-IS (rows streamed in chunks) vs the registry loss
    on the expanded ``[N, G, V]`` branches, values and gradients;
  - ``gdn_replay``: GDN indexed state replay (hybrid targets): torch replay and the Triton tree kernel vs every
    node scored as its own sequence (``gdn_tree_naive``) or vs each other;
  - ``sparse_attention``: the QSA indexer's tree selection vs each node decoded as the last token of its branch
    (``qsa_tree_naive``), and torch / Triton sparse attention over it;
  - ``draft_sampler``: the served draft sampler ``sampled_drafts.sample_block`` (frequencies vs q, greedy rows).
Then each kernel passes or fails by the tolerances of ``benchmarks/kernels_gpu/checks.py`` (``verification`` in
the result) and its verified record is written (``--records``, default on CUDA: the package's
``specopd_kernels/verified_kernels.json``), tied to the kernel's source hash: on CUDA the server and trainer run a
kernel by default only with a passed record for its current source (:mod:`specopd_kernels.verified`). Commit the
result file and the records. The result file is never overwritten: an earlier one moves to
``benchmarks/results/history/``. ``--device cpu --small`` runs tiny shapes on CPU (Triton under
TRITON_INTERPRET=1): the test suite's smoke run; its records (device ``cpu``) never verify anything.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path


def _import_kernels() -> None:
    """Make ``specopd_kernels`` importable from the source tree when the package is not installed."""
    try:
        import specopd_kernels  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))


def _timed(fn, device: str, repeats: int) -> float:
    import torch

    fn()  # warm-up (compilation / autotune)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _emit(out: list, row: dict, device: str) -> None:
    """Record one case row (and show it on stderr); give the freed CUDA memory back before the next case."""
    import torch

    out.append(row)
    print(row, file=sys.stderr)
    if device == "cuda":
        torch.cuda.empty_cache()


def _value_grad_time(fns: dict, t, d0, device: str, repeats: int) -> dict:
    """Per name in ``fns`` (``fn(target, draft) -> alpha``): (alpha fp32, d sum(alpha) / d draft fp32) and the
    median forward + backward seconds under ``name + "_s"``."""
    import torch

    res = {}
    for name, fn in fns.items():
        d = d0.clone().requires_grad_(True)
        a = fn(t, d)
        (g,) = torch.autograd.grad(a.sum(), d)
        res[name] = (a.detach().float(), g.float())

        def fwd_bwd(fn=fn):
            dd = d0.clone().requires_grad_(True)
            torch.autograd.grad(fn(t, dd).sum(), dd)

        res[name + "_s"] = _timed(fwd_bwd, device, repeats)
    return res


def alpha_cases(device: str, small: bool, repeats: int) -> list:
    import torch

    from specopd_kernels.losses import acceptance_alpha, fused_acceptance_alpha

    shapes = [(8, 1000), (5, 4099)] if small else [(4096, 49152), (2048, 151936)]
    out = []
    for rows, vocab in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            gen = torch.Generator(device="cpu").manual_seed(rows + vocab)
            t = (torch.randn(rows, vocab, generator=gen) * 3).to(device, dtype)
            d0 = (t.float() + torch.randn(rows, vocab, generator=gen).to(device)).to(dtype)
            res = _value_grad_time({"fused": fused_acceptance_alpha, "reference": acceptance_alpha}, t, d0, device,
                                   repeats)
            out.append({"rows": rows, "vocab": vocab, "dtype": str(dtype).replace("torch.", ""),
                        "max_abs_alpha_diff": float((res["fused"][0] - res["reference"][0]).abs().max()),
                        "max_abs_grad_diff": float((res["fused"][1] - res["reference"][1]).abs().max()),
                        "fused_fwd_bwd_s": res["fused_s"], "reference_fwd_bwd_s": res["reference_s"],
                        "speedup": res["reference_s"] / res["fused_s"]})
            print(out[-1], file=sys.stderr)
    return out


def tree_alpha_cases(device: str, small: bool, repeats: int) -> list:
    """Proposal-tree alpha (SpecOPD's loss path): chunked (default) and fused vs the plain reference."""
    import torch

    from specopd_kernels.losses import chunked_tree_alpha, tree_alpha, tree_alpha_reference

    # (anchors A, slots G, branches N per anchor, distinct-row fraction, vocab)
    shapes = [(3, 4, 4, 0.6, 1000)] if small else [(32, 15, 16, 0.55, 49152), (32, 15, 16, 0.55, 151936)]
    out = []
    for a, g, k, frac, vocab in shapes:
        gen = torch.Generator(device="cpu").manual_seed(a * g + vocab)
        q_rows, n = a * g, a * k
        r = max(q_rows, int(frac * n * g))
        row_draft = torch.cat([torch.arange(q_rows), torch.randint(0, q_rows, (r - q_rows,), generator=gen)])
        row_index = torch.randint(0, r, (n, g), generator=gen)
        for dtype in (torch.float32, torch.bfloat16):
            t = (torch.randn(r, vocab, generator=gen) * 3).to(device, dtype)
            d0 = (torch.randn(q_rows, vocab, generator=gen) * 3).to(device, dtype)
            rd, ri = row_draft.to(device), row_index.to(device)
            res = _value_grad_time({"chunked": lambda t, d: chunked_tree_alpha(t, d, rd)[ri],
                                    "fused": lambda t, d: tree_alpha(t, d, rd, ri, "e2e_tv_fused"),
                                    "reference": lambda t, d: tree_alpha_reference(t, d, rd, ri)}, t, d0, device, repeats)
            row = {"anchors": a, "slots": g, "branches": k, "target_rows": r, "draft_rows": q_rows, "vocab": vocab,
                   "dtype": str(dtype).replace("torch.", ""), "reference_fwd_bwd_s": res["reference_s"]}
            for name in ("chunked", "fused"):
                row[f"{name}_max_abs_alpha_diff"] = float((res[name][0] - res["reference"][0]).abs().max())
                row[f"{name}_max_abs_grad_diff"] = float((res[name][1] - res["reference"][1]).abs().max())
                row[f"{name}_fwd_bwd_s"] = res[name + "_s"]
                row[f"{name}_speedup"] = res["reference_s"] / res[name + "_s"]
            out.append(row)
            print(row, file=sys.stderr)
    return out


def tree_loss_cases(device: str, small: bool, repeats: int) -> list:
    """E2E-KL / E2E-KL-IS on a proposal tree (each distinct row once) vs the expanded-branch reference."""
    import torch

    from specopd_kernels.losses import get_loss, tree_loss

    # (anchors A, slots G, branches K, distinct-row fraction, vocab): SmolLM2 (B=8) and an 8B-scale (B=16) vocab
    shapes = [(3, 4, 4, 0.6, 1000)] if small else [(32, 7, 16, 0.55, 49152), (16, 15, 16, 0.55, 151936)]
    out = []
    for a, g, k, frac, vocab in shapes:
        gen = torch.Generator(device="cpu").manual_seed(7 * a + g + vocab)
        q_rows, n = a * g, a * k
        r = max(q_rows, int(frac * n * g))
        row_draft = torch.cat([torch.arange(q_rows), torch.randint(0, q_rows, (r - q_rows,), generator=gen)])
        row_index = torch.randint(0, r, (n, g), generator=gen)
        row_token = torch.randint(0, vocab, (r,), generator=gen)
        t = (torch.randn(r, vocab, generator=gen) * 3).to(device)
        d0 = (torch.randn(q_rows, vocab, generator=gen) * 3).to(device)
        rd, ri, rt = row_draft.to(device), row_index.to(device), row_token.to(device)
        tokens = torch.cat([rt[ri[:, 1:]], torch.zeros(n, 1, dtype=torch.long, device=device)], 1)
        for name in ("e2e_fkl", "e2e_fkl_is"):
            extra = (tokens, 0.8) if name == "e2e_fkl_is" else ()

            def tree_fn(dd, name=name):
                return tree_loss(name, t, dd, rd, ri, row_token=rt, sample_temperature=0.8)

            def expanded_fn(dd, name=name, extra=extra):
                return get_loss(name)(t[ri], dd[rd[ri]], *extra)

            vals = {}
            for label, fn in (("tree", tree_fn), ("expanded", expanded_fn)):
                d = d0.clone().requires_grad_(True)
                loss = fn(d)
                (grad,) = torch.autograd.grad(loss, d)
                vals[label] = (float(loss.detach()), grad)

                def fwd_bwd(fn=fn):
                    dd = d0.clone().requires_grad_(True)
                    torch.autograd.grad(fn(dd), dd)

                vals[label + "_s"] = _timed(fwd_bwd, device, repeats)
                del loss, grad
            row = {"loss": name, "anchors": a, "slots": g, "branches": k, "target_rows": r, "draft_rows": q_rows,
                   "vocab": vocab, "tree_value": vals["tree"][0], "expanded_value": vals["expanded"][0],
                   "rel_value_diff": abs(vals["tree"][0] - vals["expanded"][0]) / max(abs(vals["expanded"][0]), 1e-12),
                   "max_abs_grad_diff": float((vals["tree"][1] - vals["expanded"][1]).abs().max()),
                   "max_abs_grad": float(vals["expanded"][1].abs().max()),
                   "tree_fwd_bwd_s": vals["tree_s"], "expanded_fwd_bwd_s": vals["expanded_s"],
                   "speedup": vals["expanded_s"] / vals["tree_s"]}
            out.append(row)
            print(row, file=sys.stderr)
            vals.clear()
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def draft_sampler_cases(device: str, small: bool) -> dict:
    """``sample_block`` (the served sampled drafts) on ``device``: frequencies of many draws vs q, greedy rows."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from sglang_specopd.server.sampled_drafts import sample_block

    draws, vocab = (2000, 8) if small else (200000, 16)
    gen = torch.Generator(device=device).manual_seed(0)
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 0.3, 1.5, -0.5] * (vocab // 8), device=device)
    logits = base.expand(draws, 2, vocab).to(torch.bfloat16)
    temps = torch.full((draws,), 0.7, device=device)
    greedy = torch.zeros(draws, dtype=torch.bool, device=device)
    greedy[:10] = True
    tokens, q = sample_block(logits, temps, greedy, gen)
    expect = torch.softmax(logits[0, 0].float() / 0.7, -1)
    freq = torch.bincount(tokens[10:].reshape(-1), minlength=vocab).float() / tokens[10:].numel()
    return {"draws": int(tokens[10:].numel()), "vocab": vocab,
            "max_abs_freq_minus_q": float((freq - expect).abs().max()),
            "q_matches_softmax": bool(torch.allclose(q[10:12], expect.expand(2, 2, vocab), atol=1e-6)),
            "greedy_rows_argmax": bool((tokens[:10] == logits[:10].argmax(-1)).all()),
            "greedy_rows_one_hot_q": bool((q[:10].max(-1).values == 1).all())}


def _tree_row(p: int, anchors: list, k: int, depth: int):
    """Layout, dense mask, node anchors / parents of ``len(anchors)`` trees of k chains of ``depth`` nodes."""
    import torch

    from specopd_kernels.tree import build_tree_layout, build_tree_mask

    parents = [[-1 if m == 0 else b * depth + m - 1 for b in range(k) for m in range(depth)] for _ in anchors]
    offsets = [sum(len(x) for x in parents[:j]) for j in range(len(anchors))]
    node_anchor = torch.tensor([x for x, ps in zip(anchors, parents) for _ in ps])
    node_parent = torch.tensor([-1 if q == -1 else q + offsets[j] for j, ps in enumerate(parents) for q in ps])
    return build_tree_layout(p, anchors, parents), lambda: build_tree_mask(p, node_anchor, node_parent)


def attention_cases(device: str, small: bool, repeats: int) -> list:
    """Tree attention on SpecOPD-shaped rows: the grouped torch path, the Triton kernel (interpreter on CPU),
    FlashInfer's packed custom mask (CUDA with flashinfer installed, fp16 / bf16) and a dense-mask SDPA, against
    the dense fp32-math reference (``tree_attention_reference``) where it fits, else
    against the grouped path. ``cached``: node rows only, against the prefix K/V (the score_trees prefix-cache hit
    path). Triton values are checked and timed only where it can run (CUDA, or CPU under TRITON_INTERPRET=1)."""
    import torch

    from specopd_kernels.tree import tree_attention_flashinfer, tree_attention_grouped, tree_attention_triton
    from specopd_kernels.tree.attention import tree_attention_reference
    from specopd_kernels.tree.flashinfer_attention import flashinfer_runs_on
    from specopd_kernels.tree.triton_attention import triton_runs_on

    # (prefix P, anchors A, branches K, scored depth D, q heads, kv heads, head dim, dtype, cached, dense reference)
    f32, bf16 = torch.float32, torch.bfloat16
    shapes = [(24, 3, 2, 3, 4, 2, 16, f32, False, True)] if small else [
        (512, 32, 8, 6, 32, 8, 128, bf16, False, True), (2048, 64, 8, 14, 32, 8, 128, bf16, False, True),
        (512, 32, 8, 6, 32, 8, 128, f32, False, True), (256, 8, 4, 7, 9, 3, 64, bf16, False, True),
        (2000, 200, 1, 1, 9, 3, 64, bf16, True, True), (8192, 32, 16, 15, 32, 8, 128, bf16, True, False),
        (2048, 32, 16, 15, 16, 2, 64, bf16, False, False)]
    out = []
    for p, a, k, depth, hq, hkv, hd, dtype, cached, dense in shapes:
        rng = random.Random(p)
        anchors = sorted(rng.randrange(p // 4, p) for _ in range(a))
        layout, mask_fn = _tree_row(p, anchors, k, depth)
        layout = layout.to(device)
        t = p + layout.num_nodes
        gen = torch.Generator(device="cpu").manual_seed(t)
        q, kk, v = (torch.randn(t, h, hd, generator=gen).to(device, dtype) for h in (hq, hkv, hkv))
        rows = slice(p, None) if cached else slice(None)
        args = (q[rows], kk[rows], v[rows], layout)
        kw = {"prefix_kv": (kk[:p], v[:p])} if cached else {}
        mask = mask_fn().to(device) if dense else None
        with torch.no_grad():
            grouped = tree_attention_grouped(*args, **kw)
            ref = tree_attention_reference(q, kk, v, mask)[rows] if dense else grouped
            row = {"prefix": p, "anchors": a, "branches": k, "depth": depth, "tokens": t, "heads": [hq, hkv, hd],
                   "dtype": str(dtype), "cached": cached, "reference": "dense" if dense else "grouped",
                   "max_abs_diff": float((grouped.float() - ref.float()).abs().max()),
                   "grouped_s": _timed(lambda: tree_attention_grouped(*args, **kw), device, repeats)}
            if dense:
                row["reference_dense_s"] = _timed(lambda: tree_attention_reference(q, kk, v, mask), device, repeats)
                row["speedup"] = row["reference_dense_s"] / row["grouped_s"]
                qt, kt, vt = (x.transpose(0, 1) for x in (q, kk, v))
                row["sdpa_dense_mask_s"] = _timed(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, attn_mask=mask, enable_gqa=hq > hkv), device, repeats)
            del grouped
            if triton_runs_on(device):
                got = tree_attention_triton(*args, **kw)
                row["triton_max_abs_diff"] = float((got.float() - ref.float()).abs().max())
                row["triton_s"] = _timed(lambda: tree_attention_triton(*args, **kw), device, repeats)
                row["triton_speedup_vs_grouped"] = row["grouped_s"] / row["triton_s"]
                if dense:
                    row["triton_speedup_vs_sdpa_dense"] = row["sdpa_dense_mask_s"] / row["triton_s"]
                del got
            if flashinfer_runs_on(device) and dtype != torch.float32:  # FlashInfer: fp16 / bf16 only, CUDA only
                got = tree_attention_flashinfer(*args, **kw)
                row["flashinfer_max_abs_diff"] = float((got.float() - ref.float()).abs().max())
                row["flashinfer_s"] = _timed(lambda: tree_attention_flashinfer(*args, **kw), device, repeats)
                row["flashinfer_speedup_vs_grouped"] = row["grouped_s"] / row["flashinfer_s"]
                del got
        del ref, mask, q, kk, v, args, kw
        _emit(out, row, device)
    return out


def gdn_cases(device: str, small: bool, repeats: int) -> list:
    """GDN indexed state replay (hybrid targets, :mod:`specopd_kernels.gdn`) on SpecOPD-shaped rows: the torch
    replay and the Triton tree kernel (UNVERIFIED until this runs on a GPU) vs scoring every node as its own
    sequence (``gdn_tree_naive``, where it fits; else vs the torch replay). Timed: whole replay (torch / Triton
    tree part) and the tree part alone (torch level by level vs the Triton walk); the naive once."""
    import torch

    from specopd_kernels.gdn import gdn_layout_from_tree_layout, gdn_tree_naive, gdn_tree_replay, random_gdn_params
    from specopd_kernels.gdn.replay import replay_prefix, tree_nodes_torch
    from specopd_kernels.gdn.triton_replay import gdn_tree_nodes_triton, gdn_tree_replay_triton
    from specopd_kernels.tree.triton_attention import triton_runs_on

    # (prefix P, anchors A, branches K, depth D, k heads, v heads, head dim, chunk, dtype, naive reference);
    # 16 / 32 heads of 128: Qwen3-Next-80B's GDN layers (Qwen3.5 uses the same head shape)
    f32, bf16 = torch.float32, torch.bfloat16
    shapes = [(24, 3, 2, 3, 1, 2, 16, 8, f32, True)] if small else [
        (256, 8, 4, 7, 2, 4, 128, 64, f32, True), (2048, 32, 16, 7, 16, 32, 128, 64, bf16, False),
        (8192, 32, 16, 15, 16, 32, 128, 64, bf16, False)]
    out = []
    for p, a, k, depth, h, hv, hd, chunk, dtype, naive in shapes:
        rng = random.Random(p)
        layout = gdn_layout_from_tree_layout(_tree_row(p, sorted(rng.randrange(p // 4, p) for _ in range(a)), k,
                                                       depth)[0])
        params = random_gdn_params(h, hv, hd, hd, seed=p, dtype=dtype, device=device)
        t = p + layout.num_nodes
        gen = torch.Generator(device="cpu").manual_seed(t)
        x, ga, gb = (torch.randn(t, c, generator=gen).to(device, dtype) for c in (params.conv_dim, hv, hv))
        args = (x, ga, gb, params, layout)
        with torch.no_grad():
            got = gdn_tree_replay(*args, chunk_size=chunk).output
            row = {"prefix": p, "anchors": a, "branches": k, "depth": depth, "tokens": t, "heads": [h, hv, hd],
                   "chunk": chunk, "dtype": str(dtype), "reference": "naive" if naive else "replay",
                   "max_abs_output": float(got.float().abs().max()),
                   "replay_s": _timed(lambda: gdn_tree_replay(*args, chunk_size=chunk), device, repeats)}
            prep = replay_prefix(*args, chunk_size=chunk)
            row["tree_torch_s"] = _timed(lambda: tree_nodes_torch(prep, params, layout), device, repeats)
            ref = got
            if naive:
                start = time.perf_counter()
                ref = gdn_tree_naive(*args).output
                row["naive_s"] = time.perf_counter() - start
                row["replay_max_abs_diff"] = float((got.float() - ref.float()).abs().max())
                row["replay_speedup_vs_naive"] = row["naive_s"] / row["replay_s"]
            if triton_runs_on(device):
                tri = gdn_tree_replay_triton(*args, chunk_size=chunk).output
                row["triton_max_abs_diff"] = float((tri.float() - ref.float()).abs().max())
                row["triton_max_abs_diff_vs_replay"] = float((tri.float() - got.float()).abs().max())
                row["triton_replay_s"] = _timed(lambda: gdn_tree_replay_triton(*args, chunk_size=chunk), device,
                                                repeats)
                nodes = (prep.q[p:], prep.k[p:], prep.v[p:], prep.g[p:], prep.beta[p:], prep.anchor_states, layout,
                         params.q_scale)
                row["tree_triton_s"] = _timed(lambda: gdn_tree_nodes_triton(*nodes), device, repeats)
                row["tree_triton_speedup_vs_torch"] = row["tree_torch_s"] / row["tree_triton_s"]
                del tri, nodes
        del got, ref, prep, x, ga, gb, args
        _emit(out, row, device)
    return out


def sparse_cases(device: str, small: bool, repeats: int) -> list:
    """QSA sparse attention (sparse-linear hybrid targets, :mod:`specopd_kernels.sparse`) on SpecOPD-shaped rows:
    the vectorized tree selection (torch) vs every node decoded as the last token of its branch
    (``qsa_tree_naive``, where it fits), and the sparse attention over the selection, torch and the Triton kernel
    (UNVERIFIED until this runs on a GPU), vs the naive outputs (else vs the torch path); timed, with the Triton
    full tree attention of the same row for scale. ``cached``: node rows only against the prefix K/V."""
    import torch

    from specopd_kernels.sparse import QSAConfig, qsa_tree_naive, qsa_tree_select, sparse_attention_torch
    from specopd_kernels.sparse.triton_sparse import sparse_attention_triton
    from specopd_kernels.tree import tree_attention_triton
    from specopd_kernels.tree.triton_attention import triton_runs_on

    # (prefix P, anchors A, branches K, depth D, q / kv heads, head dim, index heads, index dim, ratio r,
    #  block_topk, dtype, cached, naive reference); budget = r * block_topk (SGLang: block_topk 512 or 2048)
    f32, bf16 = torch.float32, torch.bfloat16
    shapes = [(24, 3, 2, 3, 4, 2, 16, 4, 16, 2, 4, f32, False, True)] if small else [
        (512, 8, 4, 6, 16, 4, 128, 8, 64, 4, 16, f32, False, True),
        (512, 8, 4, 6, 16, 4, 128, 8, 64, 4, 16, bf16, True, True),
        (2048, 32, 16, 15, 32, 4, 128, 32, 128, 4, 512, bf16, True, False),  # rows around the 2048 budget
        (8192, 32, 16, 15, 32, 4, 128, 32, 128, 4, 512, bf16, True, False)]
    out = []
    for p, a, k, depth, hq, hkv, hd, hi, di, ratio, kb, dtype, cached, naive in shapes:
        rng = random.Random(p + kb)
        layout = _tree_row(p, sorted(rng.randrange(p // 4, p) for _ in range(a)), k, depth)[0].to(device)
        t = p + layout.num_nodes
        gen = torch.Generator(device="cpu").manual_seed(t)
        cfg = QSAConfig(budget=ratio * kb, compress_ratio=ratio, k_norm_weight=0.1 * torch.randn(di, generator=gen),
                        rotary_dim=di // 2)
        q, kk, v = (torch.randn(t, h, hd, generator=gen).to(device, dtype) for h in (hq, hkv, hkv))
        iq = torch.randn(t, hi, di, generator=gen).to(device, dtype)
        ik = torch.randn(t, di, generator=gen).to(device, dtype)
        rows = slice(p, None) if cached else slice(None)
        kw = {"prefix_kv": (kk[:p], v[:p])} if cached else {}
        with torch.no_grad():
            sel = qsa_tree_select(iq[rows], ik[:p], ik[p:], layout, cfg)
            args = (q[rows], kk[rows], v[rows], sel.indices)
            got = sparse_attention_torch(*args, **kw)
            row = {"prefix": p, "anchors": a, "branches": k, "depth": depth, "tokens": t, "heads": [hq, hkv, hd],
                   "index": [hi, di, ratio, cfg.budget], "dtype": str(dtype), "cached": cached,
                   "scored_rows": int(sel.scored.sum()), "rows": int(sel.scored.numel()),
                   "mean_selected": float(sel.counts.float().mean()), "reference": "naive" if naive else "torch",
                   "select_s": _timed(lambda: qsa_tree_select(iq[rows], ik[:p], ik[p:], layout, cfg), device, repeats),
                   "torch_s": _timed(lambda: sparse_attention_torch(*args, **kw), device, repeats)}
            ref = got
            if naive:
                start = time.perf_counter()
                ref, _, idx = qsa_tree_naive(q, kk, v, iq, ik, layout, cfg)
                row["naive_s"] = time.perf_counter() - start
                ref, idx = ref[rows], idx[rows]
                row["selection_matches_naive"] = bool(torch.equal(sel.indices, idx))
                row["torch_max_abs_diff"] = float((got.float() - ref.float()).abs().max())
            if triton_runs_on(device):
                tri = sparse_attention_triton(*args, **kw)
                row["triton_max_abs_diff"] = float((tri.float() - ref.float()).abs().max())
                row["triton_max_abs_diff_vs_torch"] = float((tri.float() - got.float()).abs().max())
                row["triton_s"] = _timed(lambda: sparse_attention_triton(*args, **kw), device, repeats)
                row["triton_speedup_vs_torch"] = row["torch_s"] / row["triton_s"]
                targs = (q[rows], kk[rows], v[rows], layout)
                row["full_tree_attention_triton_s"] = _timed(lambda: tree_attention_triton(*targs, **kw), device,
                                                             repeats)
                del tri, targs
        del got, ref, sel, args, q, kk, v, iq, ik, kw
        _emit(out, row, device)
    return out


SECTIONS = ("alpha", "tree_alpha", "tree_attention", "tree_losses", "gdn_replay", "sparse_attention",
            "draft_sampler")


def _run_section(name: str, device: str, small: bool, repeats: int):
    if name == "draft_sampler":
        return draft_sampler_cases(device, small)
    fn = {"alpha": alpha_cases, "tree_alpha": tree_alpha_cases, "tree_attention": attention_cases,
          "tree_losses": tree_loss_cases, "gdn_replay": gdn_cases, "sparse_attention": sparse_cases}[name]
    return fn(device, small, repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every section (the default when --only is not given)")
    ap.add_argument("--only", default=None, help=f"comma-separated sections out of {', '.join(SECTIONS)}")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/kernels_gpu.json")
    ap.add_argument("--records", default=None, help="verified-kernel records file to update (default on CUDA: the "
                                                    "package's specopd_kernels/verified_kernels.json; on CPU: none)")
    ap.add_argument("--git-commit", default=None,
                    help="commit to record when the tree is a copy without .git (default: detected)")
    args = ap.parse_args(argv)
    sections = SECTIONS if args.all or not args.only else tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(f"error: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    _import_kernels()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (use --device cpu --small for a CPU smoke run)", file=sys.stderr)
        return 2
    payload = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "section_wall_s": {}}
    for name in sections:
        start = time.perf_counter()
        payload[name] = _run_section(name, args.device, args.small, args.repeats)
        payload["section_wall_s"][name] = round(time.perf_counter() - start, 3)
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]  # results.py needs only the standard library; kernels_gpu.checks
    from kernels_gpu.checks import kernel_checks, records, summary
    from sglang_specopd.app.results import portable, result_header, write_result

    summ = summary(kernel_checks(payload))
    payload["verification"] = summ
    for kernel, s in summ.items():
        print(f"{kernel}: {'not run' if s['passed'] is None else 'PASS' if s['passed'] else 'FAIL'} "
              f"({s['checks']} checks{'; failed: ' + ', '.join(s['failed']) if s['failed'] else ''})", file=sys.stderr)
    if args.git_commit:  # a device machine's copy of the tree carries no .git
        payload["git_commit"] = args.git_commit
    out = write_result(args.out, payload, command="python " + " ".join(sys.argv))
    print(f"wrote {args.out}", file=sys.stderr)
    records_path = args.records
    if records_path is None and args.device == "cuda":
        from specopd_kernels.verified import RECORDS_FILE

        records_path = str(RECORDS_FILE)
    if records_path:
        from specopd_kernels.verified import write_records

        head = result_header()
        head["versions"]["triton"] = _triton_version()
        recs = records(summ, device=args.device, gpu=payload["device"] if args.device == "cuda" else None,
                       versions=head["versions"], git_commit=payload.get("git_commit") or head["git_commit"],
                       created=head["created"], result_file=portable(str(out)))
        write_records(recs, Path(records_path))
        print(f"wrote {len(recs)} verified-kernel record(s) to {records_path}", file=sys.stderr)
    return 0 if all(s["passed"] is not False for s in summ.values()) else 1


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
