"""One markdown report (+ PNG plots) from the result files in ``benchmarks/results/``.

Opens with the results summary (:mod:`sglang_specopd.app.bench.report.summary`), which ``--readme`` also writes
into README.md (:mod:`sglang_specopd.app.bench.report.readme`). Reads every known result (``concurrency_*.json``,
``serve_smollm2_cpu.json``, ``sft_smollm2[_big]_cpu.json``, ``specopd_smollm2_cpu.json``,
``specopd_sweep*_smollm2_cpu.json``, ``tree_scoring_cpu.json``, ``kernels_gpu.json``; when present
``tree_scoring_gdn_cpu.json``, ``tree_scoring_qsa_cpu.json``, the reference-drafter, Draft-OPD and
drafter-architecture (``drafter_archs_smollm2_cpu.json``, :mod:`.archs`) files; not ``history/``)
defensively: a missing file or key is skipped with a line saying so, never an exception. Every number in the
report is read from those files; the findings about where speculative decoding wins or loses are derived from them
(throughput ratio, tau, and the measured cost of one draft + verify step in plain decode steps, the break-even
tau). Plots use matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from sglang_specopd.app.bench.report.archs import drafter_archs_section
from sglang_specopd.app.bench.report.headline import headline_table
from sglang_specopd.app.bench.report.plots import plot_acceptance, plot_speedup, plot_throughput
from sglang_specopd.app.bench.report.readme import (README_END, README_START, check_readme,  # noqa: F401 (API)
                                                    update_readme)
from sglang_specopd.app.bench.report.sections import (_f, _get, _kernels_gpu_section, _provenance, _specopd_throughput,
                                                  _sweep_section)
from sglang_specopd.app.bench.report.serving import is_bench_serve, is_reference_serving, reference_serving_section
from sglang_specopd.app.bench.report.summary import SUMMARY_END, SUMMARY_START, results_summary  # noqa: F401

KNOWN_FILES = ("serve_smollm2_cpu.json", "sft_smollm2_cpu.json", "sft_smollm2_big_cpu.json",
               "specopd_smollm2_cpu.json", "tree_scoring_cpu.json", "kernels_gpu.json")
# read when present, no "skipped" note when absent (results of work in progress)
OPTIONAL_FILES = ("cpu_dtype_cpu.json", "cpu_attention_smollm2_cpu.json", "reference_corpus_smollm2_cpu.json",
                  "reference_drafter_smollm2_cpu.json", "tree_scoring_gdn_cpu.json", "tree_scoring_qsa_cpu.json",
                  "draft_opd_live_traffic_smollm2_cpu.json", "verify_cost_smollm2_cpu.json",
                  "draft_opd_smollm2_cpu.json", "drafter_archs_smollm2_cpu.json",
                  "main_job_smollm2_cpu.json", "traffic_shift_smollm2_cpu.json", "fleet_smollm2_cpu.json",
                  "fleet_c16_smollm2_cpu.json")
CONCURRENCY_GLOB = "concurrency_*.json"
SWEEP_GLOB = "specopd_sweep*_smollm2_cpu.json"
# Draft-OPD comparisons beside the main one: the LR sweep on validation prompts and held-out runs at another LR
DRAFT_OPD_GLOBS = ("draft_opd_sweep*_smollm2_cpu.json", "draft_opd_lr*_smollm2_cpu.json",
                   "goodput_smollm2_*.json")  # (and the goodput files, one per machine kind)
DOMAIN_ORDER = ("dialogue", "coding", "math", "agentic")


@dataclass(frozen=True)
class ReportOutput:
    """What :func:`build_report` wrote: the markdown, the plots, the files read and the notes on skipped ones."""

    markdown: Path
    plots: Tuple[Path, ...]
    included: Tuple[str, ...]
    skipped: Tuple[str, ...]
    readme_updated: bool


def load_results(results_dir: Path) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """``{file name: data}`` for the known result files present, and one note per file missing or unreadable."""
    results_dir = Path(results_dir)
    found: Dict[str, Dict[str, Any]] = {}
    notes: List[str] = []
    conc = sorted(results_dir.glob(CONCURRENCY_GLOB)) if results_dir.is_dir() else []
    if not conc:
        notes.append(f"`{CONCURRENCY_GLOB}`: no file in {results_dir} (skipped)")
    sweeps = sorted(results_dir.glob(SWEEP_GLOB)) if results_dir.is_dir() else []
    optional = [results_dir / n for n in OPTIONAL_FILES if (results_dir / n).is_file()]
    optional += sorted(p for g in DRAFT_OPD_GLOBS for p in (results_dir.glob(g) if results_dir.is_dir() else ()))
    for path in conc + [results_dir / n for n in KNOWN_FILES] + sweeps + optional:
        if not path.is_file():
            notes.append(f"`{path.name}`: not present (skipped)")
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            notes.append(f"`{path.name}`: unreadable ({exc}) (skipped)")
            continue
        if not isinstance(data, dict):
            notes.append(f"`{path.name}`: not a JSON object (skipped)")
            continue
        found[path.name] = data
    return found, notes


def concurrency_table(data: Mapping[str, Any]) -> str:
    """Markdown table, one row per level: throughput both ways, speedup, req/s, TTFT/ITL/TPOT p50, tau, errors."""
    rows = ["| concurrency | SpecOPD tok/s | plain tok/s | speedup | SpecOPD req/s | plain req/s | TTFT p50 s "
            "(spec / plain) | ITL p50 ms (spec / plain) | TPOT p50 ms (spec / plain) | tau | "
            "verify step / plain step | errors (spec / plain) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in data.get("levels") or []:
        s, b = lv.get("specopd") or {}, lv.get("baseline") or {}
        rows.append(
            f"| {lv.get('concurrency', '?')} | {_f(s.get('output_tokens_per_s'))} | {_f(b.get('output_tokens_per_s'))}"
            f" | {_f(_get(lv, 'speedup', 'output_tokens_per_s'), suffix='x')} | {_f(s.get('requests_per_s'), 3)}"
            f" | {_f(b.get('requests_per_s'), 3)} | {_f(s.get('ttft_p50_s'))} / {_f(b.get('ttft_p50_s'))}"
            f" | {_f(s.get('itl_p50_s'), 1, 1e3)} / {_f(b.get('itl_p50_s'), 1, 1e3)}"
            f" | {_f(s.get('tpot_p50_s'), 1, 1e3)} / {_f(b.get('tpot_p50_s'), 1, 1e3)}"
            f" | {_f(s.get('mean_acceptance_length'), 3)} | {_f(_get(lv, 'speedup', 'verify_cost_ratio'))}"
            f" | {s.get('errors', '-')} / {b.get('errors', '-') if b else '-'} |")
    return "\n".join(rows)


def concurrency_findings(data: Mapping[str, Any]) -> List[str]:
    """Where speculative decoding wins or loses, per level and overall, with the reason read off the numbers."""
    lines: List[str] = []
    levels = [lv for lv in data.get("levels") or [] if _get(lv, "speedup", "output_tokens_per_s") is not None]
    if not levels:
        return ["No level has both a speculative and a baseline measurement, so no speedup can be stated."]
    wins, losses, ratios = [], [], []
    for lv in levels:
        c, sp = lv.get("concurrency"), lv["speedup"]["output_tokens_per_s"]
        tau, r = _get(lv, "specopd", "mean_acceptance_length"), _get(lv, "speedup", "verify_cost_ratio")
        (wins if sp > 1 else losses).append(c)
        if r is not None:
            ratios.append((c, r))
        why = (f"tau {_f(tau, 3)} {'above' if tau is not None and tau > r else 'below'} the break-even "
               f"{_f(r)} (one draft + verify step costs {_f(r)} plain decode steps)" if r is not None else
               f"tau {_f(tau, 3)}")
        lines.append(f"- Concurrency {c}: speculative decoding **{'wins' if sp > 1 else 'loses'}**, "
                     f"{_f(sp)}x the plain server's output tokens/s; {why}.")
    if wins and not losses:
        lines.append(f"- It wins at every measured concurrency ({', '.join(map(str, wins))}).")
    elif losses and not wins:
        lines.append(f"- It loses at every measured concurrency ({', '.join(map(str, losses))}).")
    else:
        lines.append(f"- It wins at concurrency {', '.join(map(str, wins))} and loses at "
                     f"{', '.join(map(str, losses))}.")
    measured = (f" Measured here: {_f(min(r for _, r in ratios))} to {_f(max(r for _, r in ratios))} plain decode "
                f"steps per draft + verify step." if ratios else "")
    lines.append("- Why: a step emits tau tokens but costs one drafter forward plus one target forward over the "
                 "whole block; speculative decoding pays off only while tau exceeds that cost in plain decode "
                 "steps. On a CPU the target's forward cost grows with the number of positions it processes (there "
                 "is no idle parallel compute to hide the extra block positions, unlike memory-bound decoding on a "
                 "GPU), so the break-even tau is above 1." + measured)
    if len(ratios) >= 2:
        (c0, r0), (c1, r1) = ratios[0], ratios[-1]
        trend = "grows" if r1 > r0 else "shrinks"
        lines.append(f"- The cost of a step in plain decode steps {trend} from {_f(r0)} at concurrency {c0} to "
                     f"{_f(r1)} at {c1}" + (": batching already keeps the cores busy, so the extra verified "
                                            "positions cost nearly full price and the advantage shrinks as "
                                            "concurrency grows." if r1 > r0 else "."))
    return lines


def _concurrency_section(name: str, data: Mapping[str, Any]) -> str:
    acc = data.get("acceptance") or {}
    per_domain = acc.get("acceptance_per_domain") or {}
    spec = _get(data, "servers", "specopd") or {}
    parts = [f"### `{name}`", "", f"Produced by {_provenance(data)}.", "",
             f"Drafter: `{spec.get('drafter', '?')}` ({spec.get('drafter_choice') or 'as served'}); "
             f"{len(data.get('prompts') or [])} held-out prompts per level, {data.get('max_new_tokens', '?')} new "
             f"tokens max, T={data.get('temperature', '?')}, endpoint {data.get('endpoint', '?')}.", "",
             concurrency_table(data), ""]
    if acc:
        parts += [f"Acceptance over all levels: tau {_f(acc.get('mean_acceptance_length'), 3)} from "
                  f"{acc.get('verify_ct', '?')} verify steps; per domain "
                  + ", ".join(f"{d} {_f(t, 3)}" for d, t in per_domain.items())
                  + f"; accepted-drafts histogram (bucket k = steps accepting k drafts) "
                    f"{acc.get('acceptance_histogram')}.", ""]
    parts += ["Where speculative decoding wins or loses on this machine:", ""] + concurrency_findings(data) + [""]
    return "\n".join(parts)


def _other_sections(results: Mapping[str, Mapping[str, Any]]) -> List[str]:
    out: List[str] = []
    serve = results.get("serve_smollm2_cpu.json")
    if serve:
        out += ["### `serve_smollm2_cpu.json`", "", f"Produced by {_provenance(serve)}.", "",
                f"- Greedy identity plain vs SPECOPD in float32: {serve.get('all_greedy_identical_fp32', '-')}; "
                f"bf16 match rate {_f(serve.get('bf16_match_rate'))}.",
                f"- Concurrency-1 tokens/s: plain {_f(_get(serve, 'tokens_per_s', 'plain'))}, SPECOPD "
                f"{_f(_get(serve, 'tokens_per_s', 'specopd'))}; tau {_f(serve.get('mean_acceptance_length'), 3)} "
                f"(drafter: {serve.get('drafter', '?')}).", ""]
    for name in ("sft_smollm2_cpu.json", "sft_smollm2_big_cpu.json", "specopd_smollm2_cpu.json"):
        data = results.get(name)
        acc = (data or {}).get("acceptance")
        if not isinstance(acc, Mapping):
            continue
        out += [f"### `{name}`", "", f"Produced by {_provenance(data)}.", "",
                "| drafter | T | " + " | ".join(DOMAIN_ORDER) + " | mean |", "|---|---|" + "---:|" * 5]
        for method, temps in acc.items():
            for t, taus in (temps or {}).items() if isinstance(temps, Mapping) else ():
                vals = [_get(taus, d) for d in DOMAIN_ORDER]
                mean = _get(taus, "mean")
                if mean is None and all(v is not None for v in vals):
                    mean = sum(vals) / len(vals)
                out.append(f"| {method} | {t} | " + " | ".join(_f(v, 3) for v in vals) + f" | {_f(mean, 3)} |")
        if name == "specopd_smollm2_cpu.json":
            out += _specopd_throughput(data)
        out.append("")
    for name in sorted(n for n in results if n.startswith("specopd_sweep")):
        out += _sweep_section(name, results[name])
    out += drafter_archs_section(results.get("drafter_archs_smollm2_cpu.json"))
    out += _kernels_gpu_section(results.get("kernels_gpu.json"))
    for name in ("tree_scoring_cpu.json", "tree_scoring_gdn_cpu.json", "tree_scoring_qsa_cpu.json"):
        out += _tree_scoring_section(name, results.get(name))
    return out


def _tree_scoring_section(name: str, tree) -> list:
    """The per-case table of a ``tree_scoring*.json`` file ([] when absent or malformed)."""
    out: list = []
    if tree and isinstance(tree.get("cases"), list):
        out += [f"### `{name}`", "", f"Produced by {_provenance(tree)}.", "",
                "Supervised tokens/s; the roofline fraction is the cold tree call's token-forwards/s (prefix + "
                "nodes) over a plain prefill of as many tokens on the same server; warm: the reference's K/V from "
                "the score_trees prefix cache; with head: the roofline plus the LM head over the scored rows "
                "(`head_s`).", "",
                "| anchors | branches | block | prefix | tree tok/s | warm tok/s | per-branch tok/s | ratio "
                "| prefill tok/s | roofline fraction | with head | max abs log-prob diff |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in tree["cases"]:
            out.append(f"| {c.get('anchors', '-')} | {c.get('branches', '-')} | {c.get('block_size', '-')} | "
                       f"{c.get('prefix_len', '-')} | {_f(c.get('tree_tokens_per_s'), 1)} | "
                       f"{_f(c.get('tree_warm_tokens_per_s'), 1)} | "
                       f"{_f(c.get('per_branch_tokens_per_s'), 1)} | {_f(c.get('ratio'))}x | "
                       f"{_f(c.get('prefill_tokens_per_s'), 1)} | {_f(c.get('roofline_fraction'))} | "
                       f"{_f(c.get('roofline_fraction_with_head'))} | "
                       f"{_f(c.get('max_abs_logprob_diff'), 6)} |")
        out.append("")
    return out


def acceptance_series(results: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, float]]:
    """``{series label: {domain: tau}}`` from every held-out result with per-domain acceptance (T0 where there is a
    choice; runs on validation prompts are left out)."""
    series: Dict[str, Dict[str, float]] = {}
    for name, data in results.items():
        if name.startswith("concurrency_"):
            taus = _get(data, "acceptance", "acceptance_per_domain") or {}
            series[f"{name[:-5]} (T={data.get('temperature', '?')})"] = taus
        elif _get(data, "eval", "split") == "validation":
            continue  # tuning runs on validation prompts: not held-out numbers, kept out of this plot
        elif isinstance(data.get("acceptance"), Mapping):
            for method, temps in data["acceptance"].items():
                if isinstance(_get(temps, "T0"), Mapping):
                    series[f"{name[:-5]}: {method} (T=0)"] = temps["T0"]
    clean = {k: {d: float(v[d]) for d in DOMAIN_ORDER if isinstance(v.get(d), (int, float))}
             for k, v in series.items()}
    return {k: v for k, v in clean.items() if v}


def _display(results_dir: Path) -> str:
    """``results_dir`` relative to the working directory when inside it (``benchmarks/results``), else as given."""
    rel = os.path.relpath(results_dir.resolve(), Path.cwd())
    return results_dir.as_posix() if rel.startswith("..") else Path(rel).as_posix()


def build_report(results_dir: Path, out: Path, readme: Optional[Path] = None) -> ReportOutput:
    """Write ``out`` (markdown) and its PNGs next to it; with ``readme``, replace the README's generated blocks.

    The README's serving block (:data:`README_START` / :data:`README_END`) is required; its results summary block
    (:data:`SUMMARY_START` / :data:`SUMMARY_END`) is filled when present. Raises FileNotFoundError if ``readme`` is
    given but missing, ValueError if it lacks the serving markers.
    """
    out = Path(out)
    if readme is not None:
        check_readme(Path(readme))  # before anything is written
    results, notes = load_results(Path(results_dir))
    conc = {n: d for n, d in results.items() if n.startswith("concurrency_") and is_bench_serve(d)}
    refs = {n: d for n, d in results.items() if n.startswith("concurrency_") and is_reference_serving(d)}
    notes += [f"`{n}`: neither a `specopd bench serve` nor a concurrency_reference.py result (skipped)"
              for n, d in results.items() if n.startswith("concurrency_") and n not in conc and n not in refs]
    out.parent.mkdir(parents=True, exist_ok=True)
    plots: List[Path] = []
    if conc:
        plots += [plot_throughput(conc, out.parent / "throughput_vs_concurrency.png"),
                  plot_speedup(conc, out.parent / "speedup_vs_concurrency.png")]
    series = acceptance_series(results)
    if series:
        plots.append(plot_acceptance(series, out.parent / "acceptance_per_domain.png"))
    ref_md = ["\n".join(reference_serving_section(n, d)) for n, d in refs.items()]
    conc_md = [_concurrency_section(n, d) for n, d in conc.items()]
    shown = _display(Path(results_dir))
    headline = headline_table(results, shown)
    summary = results_summary(results, shown)
    md = ["# Benchmark report", "",
          f"Generated by `specopd bench report` from `{results_dir}`; every number below is read from those files "
          "(each records its command, git commit, machine and versions).", ""]
    md += ["## Summary", ""] + headline + ["", "Every result file, one item each:", ""] + summary + [""]
    md += ["## Serving throughput: speculative vs autoregressive", ""] + (ref_md + conc_md or
                                                                            ["No concurrency result.", ""])
    md += [f"![{p.stem}]({p.name})" for p in plots] + [""]
    md += ["## Other results", ""] + _other_sections(results)
    md += ["## Skipped", ""] + ([f"- {n}" for n in notes] or ["- nothing"]) + [""]
    out.write_text("\n".join(md))
    updated = False
    if readme is not None:
        rel = os.path.relpath(out.resolve(), Path(readme).resolve().parent)
        block = [f"Serving with the shipped drafter (every serving run, with plots: [{rel}]({rel})):", ""] + (
            [sec.replace("### ", "#### ", 1) for sec in ref_md] or [sec.replace("### ", "#### ", 1) for sec in conc_md]
            or ["No concurrency result yet."])
        readme_summary = headline + ["", f"Per-arm detail and every other result: [{rel}]({rel})."]
        updated = update_readme(Path(readme), "\n".join(block), "\n".join(readme_summary))
    return ReportOutput(out, tuple(plots), tuple(results), tuple(notes), updated)
