"""The short headline table of the results: the numbers a user would quote, each naming the result file it is read
from. README.md's results block is this table (``specopd bench report --readme``); ``benchmarks/REPORT.md`` opens
its summary with it, followed by the full per-file items (:mod:`.summary`) that hold every per-arm detail.

Every value is formatted exactly as the file's summary item formats it (the same helpers), so each number of a row
also appears in that item: ``tests/test_report_consistency.py`` checks it. Only committed result files are read (a
drafter from the git-ignored ``runs/`` folder never leads); a missing file or key drops its row.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from sglang_specopd.app.bench.report.sections import _f, _get, _num, ci_text

Row = Tuple[str, str, str]  # (what, value, result file)
KERNEL_STATUS_FILE = "kernels/specopd_kernels/verified_kernels.json"


def _span(values) -> Optional[str]:
    vals = sorted(float(v) for v in values if _num(v))
    if not vals:
        return None
    lo, hi = _f(vals[0], 1), _f(vals[-1], 1)
    return (lo if lo == hi else f"{lo}-{hi}") + "x"


def _serving(name: str, data: Mapping[str, Any]) -> List[Row]:
    rows = []
    for key in sorted((data.get("temperatures") or {})):
        levels = [lv for lv in data["temperatures"][key] if isinstance(lv, Mapping) and _num(lv.get("speedup"))]
        if not levels:
            continue
        acc = levels[0].get("acceptance") or {}
        ci = acc.get("ci95") or [None, None]
        conc = " / ".join(str(lv.get("concurrency", "?")) for lv in levels)
        rows.append((f"Serving with the shipped drafter vs plain serving, {key} (output tokens/s at concurrency "
                     f"{conc})", " / ".join(_f(lv["speedup"]) + "x" for lv in levels)
                     + f"; tau {_f(acc.get('mean'), 3)} [{_f(ci[0], 3)}, {_f(ci[1], 3)}]", name))
    return rows


def _break_even(name: str, data: Mapping[str, Any]) -> List[Row]:
    served = data.get("served") or {}
    if not _num(served.get("break_even_tau")):
        return []
    return [("Break-even tau of a served speculative step on this CPU (concurrency 1)",
             f"{_f(served['break_even_tau'], 2)} (measured {_f(served.get('tau'), 3)})", name)]


def _reference(name: str, data: Mapping[str, Any]) -> List[Row]:
    acc = data.get("acceptance") or {}
    if not all(_num((acc.get(k) or {}).get("mean")) for k in ("T0", "T1")):
        return []
    return [("Shipped reference drafter, served held-out tau", f"T0 {ci_text(acc['T0'])}, T1 {ci_text(acc['T1'])}",
             name)]


def _mean(taus: Any) -> Optional[float]:
    from sglang_specopd.app.bench.report.summary import _mean_tau

    return _mean_tau(taus)


def _specopd(name: str, data: Mapping[str, Any]) -> List[Row]:
    acc = data.get("acceptance") or {}
    spec, cont = acc.get("specopd"), acc.get("sft_continued")
    rows = []
    if isinstance(spec, Mapping) and isinstance(cont, Mapping):
        rows.append(("SpecOPD vs continued SFT at equal supervised tokens, held-out mean tau T0 / T1",
                     f"{_f(_mean(spec.get('T0')), 3)} / {_f(_mean(spec.get('T1')), 3)} vs "
                     f"{_f(_mean(cont.get('T0')), 3)} / {_f(_mean(cont.get('T1')), 3)}", name))
    ratio = _get(data, "throughput_ratios", "end_to_end")
    if _num(ratio):
        rows.append(("Supervised tokens/s, SpecOPD over sequential-rollout OPD (end to end)", f"{_f(ratio, 1)}x",
                     name))
    return rows


def _tree(name: str, data: Mapping[str, Any], label: str) -> List[Row]:
    span = _span(c.get("ratio") for c in data.get("cases") or [] if isinstance(c, Mapping))
    return [(f"One `score_trees` forward vs stock SGLang scoring each branch, {label} (supervised tokens/s)", span,
             name)] if span else []


def _draft_opd(name: str, data: Mapping[str, Any]) -> List[Row]:
    d = _get(data, "paired_diff_vs_sft_continued", "draft_opd", "T0") or {}
    lr = _get(data, "lr", "opd") or _get(data, "lr", "draft_opd")
    if not _num(d.get("mean")):
        return []
    noise = ", inside the noise" if d.get("inside_noise") else ""
    lr_txt = f", LR {lr:g}" if _num(lr) else ""
    return [(f"Draft-OPD minus continued SFT, held-out tau T0 (paired{lr_txt})", f"{ci_text(d, signed=True)}{noise}",
             name)]


def _greedy(name: str, data: Mapping[str, Any]) -> List[Row]:
    prompts = [p for p in data.get("prompts") or [] if isinstance(p, Mapping)]
    if not prompts:
        return []
    same = sum(1 for p in prompts if p.get("greedy_identical") is True)
    return [(f"SPECOPD output identical to plain serving (greedy, {data.get('greedy_identity_dtype', '?')})",
             f"{same} of {len(prompts)} prompts", name)]


def _kernels(name: str, data: Mapping[str, Any]) -> List[Row]:
    span = _span(c.get("speedup") for c in data.get("alpha") or [] if isinstance(c, Mapping))
    device = data.get("device") or _get(data, "machine", "gpu") or "a GPU"
    return [(f"Fused Triton E2E-TV alpha vs the torch reference on {device} (forward + backward; an earlier commit)",
             f"{span} faster", name)] if span else []


def headline_rows(results: Mapping[str, Mapping[str, Any]]) -> List[Row]:
    """The rows present in ``results`` (``{file name: data}``), in reading order."""
    from sglang_specopd.app.bench.report.adapt import headline as adapt_rows

    rows: List[Row] = adapt_rows(results)  # the product's reason to exist leads
    for name, fn in (("concurrency_reference_smollm2_cpu.json", _serving),
                     ("verify_cost_smollm2_cpu.json", _break_even),
                     ("reference_drafter_smollm2_cpu.json", _reference),
                     ("specopd_smollm2_cpu.json", _specopd),
                     ("draft_opd_lr3e-5_smollm2_cpu.json", _draft_opd),
                     ("serve_smollm2_cpu.json", _greedy)):
        if isinstance(results.get(name), Mapping):
            rows += fn(name, results[name])
        if name.startswith("concurrency_reference"):  # the goodput policy's rows follow the fixed block's
            from sglang_specopd.app.bench.report.goodput import goodput_headline

            rows += goodput_headline(results)
    for name, label in (("tree_scoring_cpu.json", "full-attention target"),
                        ("tree_scoring_gdn_cpu.json", "hybrid GDN target"),
                        ("tree_scoring_qsa_cpu.json", "sparse-linear QSA-GDN target")):
        if isinstance(results.get(name), Mapping):
            rows += _tree(name, results[name], label)
    from sglang_specopd.app.bench.report.fleet import fleet_headline

    rows += fleet_headline(results)
    if isinstance(results.get("kernels_gpu.json"), Mapping):
        rows += _kernels("kernels_gpu.json", results["kernels_gpu.json"])
    return rows


def kernel_status() -> str:
    """One line: each kernel's GPU verification for its current source (:mod:`specopd_kernels.verified`), e.g.
    ``"... tree_attention_triton unverified (no GPU record), ..."``."""
    from specopd_kernels.verified import KERNELS, is_verified, load_records

    records = load_records()
    parts = []
    for kernel in KERNELS:
        ok, why = is_verified(kernel, records)
        parts.append(f"`{kernel}` {'verified' if ok else 'unverified'} ({why})")
    return (f"Kernels on CUDA (`{KERNEL_STATUS_FILE}`): " + "; ".join(parts)
            + ". An unverified kernel is not used by default: CUDA runs its torch path (`SPECOPD_KERNELS`).")


def setup_text(name: str, data: Mapping[str, Any]) -> str:
    """Where a result was measured, from its file: machine kind (GPU, or CPU model, SIMD, cores), dtype (recorded, or
    what ``dtype: auto`` picks on that CPU for the ``cpu-smollm2*`` configs) and model; "not recorded" where the file does not say."""
    m = data.get("machine") if isinstance(data.get("machine"), Mapping) else {}
    if m.get("gpu"):
        kind = str(m["gpu"])
    else:
        cpu = str(m.get("cpu") or "CPU")
        cpu = "Xeon" if "Xeon" in cpu else "EPYC" if "EPYC" in cpu else cpu
        kind = f"{m.get('cores', '?')}-core {cpu}" + (f" {m['cpu_simd']}" if m.get("cpu_simd") else "")
    dtype = data.get("dtype") or _get(data, "server", "dtype") or data.get("greedy_identity_dtype")
    config = str(data.get("server_config") or _get(data, "server", "config") or _get(data, "settings", "config")
                 or _get(data, "config", "config") or "")
    if not isinstance(dtype, str) and config in ("cpu-smollm2", "cpu-smollm2-adapt") and m.get("cpu_native_bf16") \
            is not None:
        dtype = "bf16" if m["cpu_native_bf16"] else "float32"
    if name.startswith("kernels_gpu"):
        dtype = "float32 / bf16"
    model = str(data.get("target") or "").rstrip("/").split("/")[-1]
    if not model and "smollm2" in name:
        model = "SmolLM2-135M-Instruct"
    if name.startswith("kernels_gpu"):
        model = "kernels only"
    return f"{kind}, {dtype if isinstance(dtype, str) else 'dtype not recorded'}, {model or 'model not recorded'}"


def headline_table(results: Mapping[str, Mapping[str, Any]], results_dir: str = "benchmarks/results") -> List[str]:
    """Markdown lines: the table of :func:`headline_rows` (files in ``results_dir``) and the kernel status line."""
    rows = headline_rows(results)
    if not rows:
        return ["No result file yet."]
    lines = [f"Numbers to quote, each read from the result file it names in `{results_dir}/` (command, commit, machine "
             "and versions inside; earlier versions in `history/`). CPU numbers come from small shared 2-core machines of "
             "several kinds (an AVX2 EPYC without native bf16, AVX-512 Xeons and EPYCs with it; each row names its "
             "kind): compare rows only on the same machine kind.",
             "", "| result | machine, dtype, model | value | file |", "|---|---|---|---|"]
    lines += [f"| {what} | {setup_text(name, results[name])} | {value} | `{name}` |" for what, value, name in rows]
    return lines + ["", kernel_status()]
