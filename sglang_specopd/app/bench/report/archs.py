"""The drafter-architecture comparison (``drafter_archs_smollm2_cpu.json``, ``benchmarks/drafter_archs_smollm2.py``)
in the benchmark report: its results-summary item and its table. Same rules as the rest of the report: every number
read from the file, a missing key leaves its part out (or prints ``-``), never raises."""

from __future__ import annotations

from typing import Any, List, Mapping

from sglang_specopd.app.bench.report.sections import _f, _get, _int, _num, _provenance, ci_text

NAME = "drafter_archs_smollm2_cpu.json"
STAGES = ("sft", "specopd")
STAGE_LABELS = {"sft": "SFT", "specopd": "SpecOPD"}


def _diff(d: Any) -> str:
    text = ci_text(d, signed=True)
    return text + (", inside the noise" if isinstance(d, Mapping) and d.get("inside_noise") else "")


def _speedups(block: Mapping[str, Any]) -> str:
    sp = block.get("speedup") or {}
    levels = sorted((c for c in sp if _num(sp[c])), key=lambda c: int(c))
    if not levels:
        return ""
    return (f"; serving vs plain {' / '.join(_f(sp[c]) + 'x' for c in levels)} at concurrency "
            f"{' / '.join(levels)}")


def drafter_archs_summary(name: str, data: Mapping[str, Any]) -> List[str]:
    """The headline item: per architecture T0 tau after SFT and after SpecOPD (95% intervals), the paired
    differences vs DFlash and vs its own SFT, the serving speedups; the budgets; the phases still missing."""
    archs = data.get("archs")
    if not isinstance(archs, Mapping) or not archs:
        return []
    vs = _get(data, "paired_diffs", "vs_dflash") or {}
    own = _get(data, "paired_diffs", "specopd_vs_sft") or {}
    parts = []
    for arch, block in archs.items():
        stages = []
        for stage in STAGES:
            t0 = _get(block, "acceptance", stage, "T0")
            if not _num(_get(t0, "mean")):
                continue
            text = f"{STAGE_LABELS[stage]} {ci_text(t0)}"
            notes = []
            if arch != "dflash" and _get(vs, stage, arch, "T0"):
                notes.append(f"vs DFlash {_diff(_get(vs, stage, arch, 'T0'))}")
            if stage == "specopd" and _get(own, arch, "T0"):
                notes.append(f"vs its SFT {_diff(_get(own, arch, 'T0'))}")
            t1 = _get(block, "acceptance", stage, "T1", "mean")
            stages.append(text + (f" ({'; '.join(notes)})" if notes else "") + (f", T1 {_f(t1, 3)}" if _num(t1)
                                                                                  else ""))
        if stages or _speedups(block):
            parts.append(f"{arch}: " + ", ".join(stages) + _speedups(block))
    if not parts:
        return []
    missing = data.get("missing_phases") or {}
    budgets = data.get("budgets") or {}
    sizes = data.get("sizes") or {}
    return [f"- **Drafter architectures** (`{name}`, {sizes.get('num_layers', '?')} layers, block "
            f"{sizes.get('block_size', '?')} each): served tau on held-out prompts at T0 (mean of the 4 domains, 95% "
            f"bootstrap interval; paired differences on the same prompts), SFT {_int(budgets.get('sft_tokens'))} "
            f"then SpecOPD {_int(budgets.get('opd_tokens'))} supervised draft tokens per architecture: "
            + "; ".join(parts)
            + (f". Not run yet: {', '.join(f'{a} ' + '/'.join(ps) for a, ps in missing.items())}." if missing
               else ".")]


def drafter_archs_section(data: Any) -> List[str]:
    """The report's table: per architecture and stage tau at T0 / T1 with intervals, supervised tokens, wall time
    of the training phase, and the serving speedups ([] when absent)."""
    archs = _get(data, "archs")
    if not isinstance(archs, Mapping) or not archs:
        return []
    out = [f"### `{NAME}`", "", f"Produced by {_provenance(data)}.", "",
           "| architecture | stage | tau T0 | tau T1 | supervised tokens | training wall s | trainable params |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for arch, block in archs.items():
        for stage in STAGES:
            acc = _get(block, "acceptance", stage) or {}
            out.append(f"| {arch} | {STAGE_LABELS[stage]} | {ci_text(acc.get('T0'))} | {ci_text(acc.get('T1'))} | "
                       f"{_int(_get(block, 'supervised_tokens', stage))} | {_f(_get(block, 'wall_s', stage), 0)} | "
                       f"{_int(_get(block, 'params', 'trainable'))} |")
    out.append("")
    serving = [(a, c, v) for a, b in archs.items() for c, v in (_get(b, "serving") or {}).items()]
    if serving:
        out += ["| architecture | concurrency | SpecOPD drafter tok/s | plain tok/s | speedup | tau |",
                "|---|---:|---:|---:|---:|---:|"]
        out += [f"| {a} | {c} | {_f(_get(v, 'specopd_tokens_per_s'))} | {_f(_get(v, 'plain_tokens_per_s'))} | "
                f"{_f(_get(v, 'speedup'))}x | {_f(_get(v, 'tau'), 3)} |" for a, c, v in serving]
        out.append("")
    return out
