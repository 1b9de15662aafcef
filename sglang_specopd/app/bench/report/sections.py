"""Markdown sections of the benchmark report for single result files (SpecOPD throughput, validation sweeps, GPU
kernel check) and the small formatting helpers every section uses; :mod:`sglang_specopd.app.bench.report.build` assembles
them."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(d, Mapping):
            d = d.get(k)
        elif isinstance(d, list) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return None
    return d


def _f(x: Any, digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
    return f"{x * scale:.{digits}f}{suffix}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def ci_text(d: Any, signed: bool = False) -> str:
    """An interval cell of a result (``{"mean", "ci95": [lo, hi]}``) as ``"1.234 [1.200, 1.270]"`` (``signed``:
    ``"+0.012 [-0.004, +0.030]"``); ``"-"`` without a numeric mean, ``nan`` bounds without ``ci95``."""
    if not isinstance(d, Mapping) or not _num(d.get("mean")):
        return "-"
    lo, hi = d.get("ci95") or [float("nan")] * 2
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"{fmt.format(d['mean'])} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _num(x: Any) -> bool:
    """A real number (int or float, not bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int(x: Any) -> str:
    """An integer count with thousands separators (``229,376``); other values as they are."""
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else str(x)


def _specopd_throughput(data: Mapping) -> List[str]:
    """Supervised tokens/s of SpecOPD vs sequential-rollout OPD, three ways when the file has them."""
    rows = [("end to end (whole training loop)", "supervised_tokens_per_s"),
            ("supervision collection (sampling + scoring vs push + rollouts + scoring)",
             "supervised_tokens_per_s_collection"),
            ("target side (server seconds)", "supervised_tokens_per_s_target_side")]
    out = ["", "| supervised tokens/s | SpecOPD | sequential OPD | ratio |", "|---|---:|---:|---:|"]
    for label, key in rows:
        tps = data.get(key)
        if not isinstance(tps, Mapping):
            continue
        b, c = _get(tps, "specopd"), _get(tps, "sequential_opd")
        ratio = b / c if isinstance(b, (int, float)) and isinstance(c, (int, float)) and c else None
        out.append(f"| {label} | {_f(b, 1)} | {_f(c, 1)} | {_f(ratio, 1)} |")
    if len(out) <= 3:
        return ["", f"Throughput ratio {_f(data.get('throughput_ratio'))}."]
    rows = data.get("specopd_scored_rows_per_supervised_token")
    if isinstance(rows, (int, float)):
        out += ["", f"Supervised tokens count every branch token the loss trains on; SpecOPD's trie packing scores "
                    f"{_f(rows)} distinct target rows per supervised token (sequential OPD: 1, one branch per "
                    f"anchor)."]
    return out


def _provenance(data: Mapping[str, Any]) -> str:
    m = data.get("machine")
    if isinstance(m, Mapping) and m:
        gpu = (m["gpu"] or "no GPU") if "gpu" in m else "GPU unknown"
        machine = f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {gpu}"
    else:  # no machine record: say so rather than guess "no GPU"
        machine = "machine unknown"
    commit = str(data.get("git_commit", "?"))
    commit = commit[:12] + (" + uncommitted changes" if commit.endswith("+dirty") else "")
    return (f"`{data.get('command', '?')}` at commit `{commit}`, "
            f"{data.get('created', '?')}; {machine}")


def _served_drafts(data: Mapping[str, Any]) -> str:
    """How the server drafted at T=1 when the file was written (files from before the option: DFLASH's greedy)."""
    mode = _get(data, "serving", "draft_sampling") or "greedy"
    return ("T=1 drafts sampled from q, lossless verification" if mode == "sample"
            else "T=1 drafts greedy (argmax), target-only verification")


def _sweep_section(name: str, data: Optional[Mapping[str, Any]]) -> List[str]:
    """A validation sweep (``benchmarks/specopd_sweep.py``): mean tau per arm at T=0 / T=1."""
    if not data or not isinstance(data.get("arms"), list):
        return []
    val = data.get("validation") or {}
    refs = data.get("references")
    trained_on = (f"fresh references (train-split prompts from offset {refs.get('offset', '?')}, "
                  f"{refs.get('sequences', '?')} responses)" if isinstance(refs, Mapping)
                  else "the SFT start's own training responses")
    if val.get("split") == "eval":
        prompts = f"Held-out eval prompts: {val.get('limit_per_domain', '?')} per domain (arms chosen on validation)"
    else:
        prompts = (f"Validation prompts: {val.get('limit_per_domain', '?')} per domain from the train split at offset "
                   f"{val.get('offset', '?')}")
    out = [f"### `{name}`", "", f"Produced by {_provenance(data)}.", "",
           f"{prompts}; budget {data.get('budget_target_tokens', '?')} supervised tokens per arm; arms trained on "
           f"{trained_on}; {_served_drafts(data)}.", "",
           "| arm | T0 mean tau | T1 mean tau | train wall s |", "|---|---:|---:|---:|",
           f"| SFT start | {_f(_get(data, 'sft_start', 'T0', 'mean'), 3)} | "
           f"{_f(_get(data, 'sft_start', 'T1', 'mean'), 3)} | - |"]
    for arm in data["arms"]:
        out.append(f"| `{arm.get('arm', '?')}` | {_f(_get(arm, 'acceptance', 'T0', 'mean'), 3)} | "
                   f"{_f(_get(arm, 'acceptance', 'T1', 'mean'), 3)} | {_f(arm.get('train_wall_s'), 0)} |")
    return out + [""]


def _kernels_gpu_section(data: Optional[Mapping[str, Any]]) -> List[str]:
    """The GPU kernel check (``benchmarks/kernels_gpu/run.py``): parity and forward + backward speed-ups."""
    if not data:
        return []
    out = ["### `kernels_gpu.json`", "", f"Produced by {_provenance(data)}.", "",
           "| case | dtype | max abs value diff | max abs grad diff | speed-up vs reference |",
           "|---|---|---:|---:|---:|"]
    for c in data.get("alpha") or []:
        out.append(f"| fused alpha {c.get('rows')} x {c.get('vocab')} | {c.get('dtype')} | "
                   f"{_f(c.get('max_abs_alpha_diff'), 7)} | {_f(c.get('max_abs_grad_diff'), 6)} | "
                   f"{_f(c.get('speedup'))}x |")
    for c in data.get("tree_alpha") or []:
        for path in ("fused", "chunked"):
            out.append(f"| tree alpha ({path}) {c.get('target_rows')} rows x {c.get('vocab')} | {c.get('dtype')} | "
                       f"{_f(c.get(f'{path}_max_abs_alpha_diff'), 7)} | {_f(c.get(f'{path}_max_abs_grad_diff'), 6)} | "
                       f"{_f(c.get(f'{path}_speedup'))}x |")
    for c in data.get("tree_attention") or []:
        out.append(f"| grouped tree attention {c.get('tokens')} tokens | {c.get('dtype')} | "
                   f"{_f(c.get('max_abs_diff'), 5)} | - | {_f(c.get('speedup'))}x |")
    for c in data.get("tree_losses") or []:
        out.append(f"| tree loss {c.get('loss')} {c.get('target_rows')} rows x {c.get('vocab')} vs expanded | float32 | "
                   f"{_f(c.get('rel_value_diff'), 7)} (rel) | {_f(c.get('max_abs_grad_diff'), 9)} | "
                   f"{_f(c.get('speedup'))}x |")
    ds = data.get("draft_sampler")
    if ds:
        out += ["", f"Served draft sampler (`sample_block`) on the device: {ds.get('draws')} draws over "
                f"{ds.get('vocab')} tokens, max |frequency - q| {_f(ds.get('max_abs_freq_minus_q'), 4)}; q equals "
                f"softmax(z / T): {ds.get('q_matches_softmax')}; greedy rows take the argmax with a one-hot q: "
                f"{ds.get('greedy_rows_argmax') and ds.get('greedy_rows_one_hot_q')}."]
    return out + [""]
