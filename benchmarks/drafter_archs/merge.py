"""Merge the finished phases of the run directory into the comparison's result: intervals and paired differences.

Intervals (:mod:`specopd_trainer.intervals`): per architecture, drafter stage (``sft``, ``specopd``) and temperature,
tau per domain and their mean with a 95% stratified bootstrap over the held-out prompts. Paired differences on the
same prompts (the SAME bootstrap resamples for both sides): every architecture vs DFlash at each stage and
temperature (``vs_dflash``), and each architecture's SpecOPD drafter vs its own SFT drafter (``specopd_vs_sft``).
A part that cannot be computed (a domain without verify steps, no prompt in common) is ``{"error": reason}``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from draft_opd_compare.store import safe_part
from drafter_archs.store import ARCHS, BASELINE_ARCH, EVAL_PHASES, PHASES, TEMPS

STAGES = tuple(EVAL_PHASES.values())  # ("sft", "specopd")


def per_request(done: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Dict[str, list]]]:
    """{arch: {stage: {T0, T1: per-request rows}}} of every finished evaluation phase."""
    return {a: {stage: done[a][phase]["per_request"] for phase, stage in EVAL_PHASES.items() if phase in done[a]}
            for a in ARCHS if a in done}


def serving(record: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """{concurrency as str: {plain_tokens_per_s, specopd_tokens_per_s (output tokens/s), speedup (spec / plain),
    tau (mean over domains), tau_ci95}} from a ``serve`` phase record (its ``levels``)."""
    out = {}
    for lv in record.get("levels") or []:
        acc = lv.get("acceptance") or {}
        out[str(lv["concurrency"])] = {"plain_tokens_per_s": lv.get("plain_tokens_per_s"),
                                       "specopd_tokens_per_s": lv.get("specopd_tokens_per_s"),
                                       "speedup": lv.get("speedup"), "tau": acc.get("mean"),
                                       "tau_ci95": acc.get("ci95"), "errors": lv.get("errors")}
    return out


def _arch_block(phases: Mapping[str, Mapping[str, Any]], rows: Mapping[str, Mapping[str, list]],
                domains: Sequence[str], n_boot: int) -> Dict[str, Any]:
    from specopd_trainer.intervals import acceptance_intervals

    init, serve = phases.get("init") or {}, phases.get("serve")
    serv = serving(serve) if serve else {}
    return {
        "acceptance": {stage: {t: safe_part(acceptance_intervals, r[t], domains, n_boot=n_boot) for t in TEMPS}
                       for stage, r in rows.items()},
        "speedup": {c: v["speedup"] for c, v in serv.items()},
        "serving": serv,
        "params": init.get("params"),
        "spec": init.get("spec"),
        "supervised_tokens": {s: phases[s].get("supervised_tokens") for s in STAGES if s in phases},
        "steps": {s: phases[s].get("steps") for s in STAGES if s in phases},
        "wall_s": {p: phases[p].get("wall_s") for p in PHASES if p in phases},
        "drafters": {s: phases[s].get("drafter") for s in ("init",) + STAGES if s in phases},
        "serve_drafter": (serve or {}).get("drafter"),
        "serve_temperature": (serve or {}).get("temperature"),
    }


def assemble(done: Mapping[str, Mapping[str, Mapping[str, Any]]], domains: Sequence[str], *, n_boot: int = 2000
             ) -> Dict[str, Any]:
    """The measured part of the result from ``done`` ({arch: {phase: record}}, :func:`.store.finished_phases`).

    Returns ``archs`` {arch: {acceptance {stage: {T0, T1: acceptance_intervals}}, speedup {"1": x, "4": x},
    serving, params, spec, supervised_tokens {stage: n}, steps, wall_s {phase: s}, drafters}} for every arch with
    a finished phase; ``paired_diffs`` {``vs_dflash``: {stage: {arch: {T0, T1: paired_difference}}},
    ``specopd_vs_sft``: {arch: {T0, T1: paired_difference}}}; ``inside_noise``: one label per paired difference
    whose interval contains 0 (``"dflash2 vs dflash, sft, T0"``, ``"dspark specopd vs sft, T1"``);
    ``per_request`` {arch: {stage: {T: rows}}}.
    """
    from specopd_trainer.intervals import paired_difference

    rows = per_request(done)
    archs = [a for a in ARCHS if done.get(a)]
    blocks = {a: _arch_block(done[a], rows.get(a, {}), domains, n_boot) for a in archs}
    base = rows.get(BASELINE_ARCH, {})
    vs: Dict[str, Dict[str, Any]] = {}
    for stage in STAGES:
        if stage not in base:
            continue
        vs[stage] = {a: {t: safe_part(paired_difference, rows[a][stage][t], base[stage][t], domains, n_boot=n_boot)
                         for t in TEMPS}
                     for a in archs if a != BASELINE_ARCH and stage in rows.get(a, {})}
    own = {a: {t: safe_part(paired_difference, r["specopd"][t], r["sft"][t], domains, n_boot=n_boot) for t in TEMPS}
           for a, r in rows.items() if "sft" in r and "specopd" in r}
    noise: List[str] = []
    for stage, by_arch in vs.items():
        noise += [f"{a} vs {BASELINE_ARCH}, {stage}, {t}" for a, d in by_arch.items() for t in TEMPS
                  if d[t].get("inside_noise")]
    noise += [f"{a} specopd vs sft, {t}" for a, d in own.items() for t in TEMPS if d[t].get("inside_noise")]
    return {"archs": blocks, "paired_diffs": {f"vs_{BASELINE_ARCH}": vs, "specopd_vs_sft": own},
            "inside_noise": noise, "per_request": rows}


def summary_lines(measured: Mapping[str, Any]) -> List[str]:
    """One line per architecture and stage: tau T0 / T1 with intervals, the paired differences, the speedups."""
    out = []
    vs = measured["paired_diffs"][f"vs_{BASELINE_ARCH}"]
    own = measured["paired_diffs"]["specopd_vs_sft"]

    def diff(d: Mapping[str, Any]) -> str:
        if "mean" not in d:
            return "n/a"
        return f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]{' (noise)' if d['inside_noise'] else ''}"

    for a, block in measured["archs"].items():
        for stage, temps in block["acceptance"].items():
            taus = " ".join(f"{t} {temps[t]['mean']:.3f} [{temps[t]['ci95'][0]:.3f}, {temps[t]['ci95'][1]:.3f}]"
                            if "mean" in temps[t] else f"{t} n/a" for t in TEMPS)
            extra = ""
            if a != BASELINE_ARCH and a in vs.get(stage, {}):
                extra += f"; vs {BASELINE_ARCH} T0 {diff(vs[stage][a]['T0'])}, T1 {diff(vs[stage][a]['T1'])}"
            if stage == "specopd" and a in own:
                extra += f"; vs own SFT T0 {diff(own[a]['T0'])}, T1 {diff(own[a]['T1'])}"
            out.append(f"{a} {stage}: tau {taus}{extra}")
        if block["speedup"]:
            sp = ", ".join(f"c={c} {x:.2f}x" if x else f"c={c} n/a" for c, x in block["speedup"].items())
            out.append(f"{a} serving vs plain: {sp}")
    return out
