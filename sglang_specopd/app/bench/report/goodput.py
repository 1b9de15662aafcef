"""Report pieces of the goodput benchmark (``goodput_smollm2_*.json``, ``benchmarks/goodput/run.py``, one file per
machine kind): its summary item (:mod:`.summary`) and headline rows (:mod:`.headline`, one per file and temperature),
formatted by the same helpers so that every headline number appears in the item."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from sglang_specopd.app.bench.report.sections import _f, _num

Row = Tuple[str, str, str]
PREFIX = "goodput_smollm2"


def files(results: Mapping[str, Any]) -> List[str]:
    """The goodput result files present that count as a result (>= 24 prompts per domain), by name."""
    return sorted(n for n, d in results.items() if n.startswith(PREFIX) and n.endswith(".json")
                  and isinstance(d, Mapping) and d.get("counts_as_result") and _by_temperature(d))


def _by_temperature(data: Mapping[str, Any]) -> Dict[str, List[Mapping[str, Any]]]:
    out: Dict[str, List[Mapping[str, Any]]] = {}
    for lv in data.get("levels") or []:
        if isinstance(lv, Mapping) and _num(lv.get("goodput_over_plain")):
            out.setdefault(f"T{float(lv['temperature']):g}", []).append(lv)
    return {t: sorted(v, key=lambda lv: lv.get("concurrency", 0)) for t, v in sorted(out.items())}


def _ratio(lv: Mapping[str, Any], arm: str) -> str:
    """``1.17x [1.12, 1.21]`` (the arm over plain with its paired interval), or ``1.15x`` without one."""
    ci = lv.get(f"{arm}_over_plain_ci95")
    text = f"{_f(lv.get(f'{arm}_over_plain'))}x"
    return text + (f" [{_f(ci[0])}, {_f(ci[1])}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else "")


def _k0(data: Mapping[str, Any]) -> str:
    r = data.get("k0_step_over_plain_step")
    if not isinstance(r, Mapping) or not r:
        return ""
    return "; a k = 0 step over a plain step at batch " + ", ".join(f"{b}: {_f(v)}" for b, v in r.items())


def goodput_item(name: str, data: Mapping[str, Any]) -> List[str]:
    """The item: per temperature and concurrency, goodput / plain and (where that arm ran) fixed / plain with
    intervals, and the k = 0 step ratio."""
    temps = _by_temperature(data)
    if not temps:
        return []
    parts = []
    for t, levels in temps.items():
        parts.append(f"{t}: " + ", ".join(f"c={lv['concurrency']} goodput {_ratio(lv, 'goodput')}"
                                          + (f", fixed {_ratio(lv, 'fixed')}" if _num(lv.get("fixed_over_plain"))
                                             else "") for lv in levels))
    fixed = any(_num(lv.get("fixed_over_plain")) for levels in temps.values() for lv in levels)
    title = "Goodput policy vs fixed block vs plain serving" if fixed else "Goodput policy vs plain serving"
    return [f"- **{title}** (`{name}`, {data.get('limit_per_domain')} "
            f"prompts per domain, {data.get('max_new_tokens')} tokens, output tokens/s over plain's, paired by "
            f"prompt): " + "; ".join(parts) + _k0(data) + "."]


def goodput_headline(results: Mapping[str, Mapping[str, Any]]) -> List[Row]:
    """One row per goodput file and temperature: goodput / plain at each concurrency with its interval."""
    rows: List[Row] = []
    for name in files(results):
        for t, levels in _by_temperature(results[name]).items():
            conc = " / ".join(str(lv["concurrency"]) for lv in levels)
            rows.append((f"Serving with the shipped drafter, goodput policy vs plain serving, {t} (output tokens/s "
                         f"at concurrency {conc}, paired 95% interval)",
                         " / ".join(_ratio(lv, "goodput") for lv in levels), name))
    return rows
