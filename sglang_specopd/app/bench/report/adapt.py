"""Report pieces of adapting to served traffic: the main job's summary (``main_job_smollm2_cpu.json``) and the
traffic-shift benchmark (``traffic_shift_smollm2_cpu.json``), as summary items (:mod:`.summary`) and headline
rows (:mod:`.headline`). A headline value is formatted by the same helpers as its item, so it appears there."""

from __future__ import annotations

from typing import Any, List, Mapping, Tuple

from sglang_specopd.app.bench.report.sections import _f, _get, _num, ci_text

Row = Tuple[str, str, str]


def _change(d: Any) -> str:
    """``+0.412 [+0.301, +0.530] (48 prompts)``, or ``-``."""
    if not isinstance(d, Mapping) or not _num(d.get("mean")):
        return "-"
    n = sum((d.get("prompts") or {}).values())
    return f"{ci_text(d, signed=True)} ({n} prompts{', inside the noise' if d.get('inside_noise') else ''})"


def _by_domain(ch: Mapping[str, Any]) -> str:
    """``japanese +0.195 [+0.101, +0.300], wordsort ...`` over the new then the old domains, or ``-``."""
    parts = []
    for group in ("new", "old"):
        for d, v in (_get(ch, group, "by_domain") or {}).items():
            if isinstance(v, Mapping) and _num(v.get("mean")):
                parts.append(f"{d} {ci_text(v, signed=True)}")
    return ", ".join(parts) or "-"


def _speed(data: Mapping[str, Any]) -> str:
    """``plain 30.1 / start 28.0 / adapted 36.2 tokens/s, adapted / plain 1.20x [1.10, 1.31]``, or ``""``."""
    sp = data.get("speed")
    if not isinstance(sp, Mapping) or not _num(sp.get("plain")):
        return ""
    r = _get(sp, "ratios", "adapted_over_plain") or {}
    s = _get(sp, "ratios", "start_over_plain") or {}
    ci, cs = r.get("ci95") or [None, None], s.get("ci95") or [None, None]
    return (f"plain {_f(sp['plain'], 1)} / start {_f(sp.get('start'), 1)} / adapted {_f(sp.get('adapted'), 1)} "
            f"tokens/s, adapted / plain {_f(r.get('mean'))}x [{_f(ci[0])}, {_f(ci[1])}], start / plain "
            f"{_f(s.get('mean'))}x [{_f(cs[0])}, {_f(cs[1])}]")


def main_job_item(name: str, data: Mapping[str, Any]) -> List[str]:
    """The main job's item: new- and old-domain tau before -> after with the paired change, what it deployed."""
    b, a, ch = data.get("before") or {}, data.get("after") or {}, data.get("paired_change") or {}
    if not _num(_get(b, "new", "mean")):
        return []
    new = ", ".join(data.get("new_domains") or [])
    old = ", ".join(data.get("old_domains") or [])
    traffic = data.get("traffic") or {}
    return [f"- **Main job, the shipped drafter adapting to shifted traffic** (`{name}`, `specopd main` on a fresh "
            f"clone, {_f(data.get('wall_s'), 0)} s; {_f(traffic.get('old_minutes'), 0)} min of old-domain then "
            f"{_f(traffic.get('minutes'), 0)} min of {new} traffic{_old_share(traffic)}, "
            f"{traffic.get('requests', '-')} requests, "
            f"{traffic.get('errors_5xx', '-')} 5xx): served held-out tau T0 on the new domains ({new}) "
            f"{ci_text(b.get('new'))} -> {ci_text(a.get('new'))}, change {_change(ch.get('new'))}; old domains "
            f"({old}) {ci_text(b.get('old'))} -> {ci_text(a.get('old'))}, change {_change(ch.get('old'))}; "
            f"deployed: {data.get('deployed', '-')} ({data.get('reason', '-')}); change by domain: "
            f"{_by_domain(ch)}" + (f"; speed on the new domains' held-out prompts (T0, one request at a time, same "
                                    f"server): {_speed(data)}" if _speed(data) else "") + "."]


def traffic_shift_item(name: str, data: Mapping[str, Any]) -> List[str]:
    """Per arm: final held-out tau on the new / old domains and its paired difference to the static drafter."""
    arms = data.get("arms") or {}
    if not arms:
        return []
    diffs = data.get("paired_diff_vs_static") or {}
    parts = []
    for arm, v in arms.items():
        fin = v.get("final") or {}
        txt = (f"{arm}: new {ci_text(_get(fin, 'new', 'T0'))}, old {ci_text(_get(fin, 'old', 'T0'))}")
        if arm in diffs:
            txt += (f", vs static new {_change(diffs[arm].get('new'))}, old {_change(diffs[arm].get('old'))}, "
                    f"{v.get('pushes', 0)} pushes")
        parts.append(txt)
    itl = data.get("itl_p99_s") or {}
    fc = data.get("feature_cost") or {}
    extra = (f"; serving ITL p99 during the shift {_f(itl.get('no_adapter'), 3)} s without an adapter, "
             f"{_f(itl.get('adapter'), 3)} s with (worst arm); {data.get('errors_5xx', '-')} 5xx")
    if _num(fc.get("serving_overhead_fraction")):
        extra += (f"; features captured while serving cost {_f(fc['serving_overhead_fraction'], 1, 100, '%')} of "
                  f"serving throughput and give the trainer {_f(fc.get('train_tokens_per_s_with'), 0)} vs "
                  f"{_f(fc.get('train_tokens_per_s_without'), 0)} tokens/s of features (second pass)")
    missing = data.get("arms_not_run") or []
    if missing:
        extra += f"; arms not run: {', '.join(missing)}"
    return [f"- **Adapting to shifted traffic** (`{name}`, {_f(data.get('shift_minutes'), 0)} min of "
            f"{', '.join(data.get('new_domains') or {})} traffic after {_f(data.get('old_minutes'), 0)} min of the old "
            f"domains, served held-out tau T0 at the end): " + "; ".join(parts) + extra + "."]


def _old_share(traffic: Mapping[str, Any]) -> str:
    share = traffic.get("old_share")
    return f" ({100 * share:.0f}% of it still old-domain)" if _num(share) and share > 0 else ""


def headline(results: Mapping[str, Mapping[str, Any]]) -> List[Row]:
    """Headline rows of the two files, when present."""
    rows: List[Row] = []
    ts = results.get("traffic_shift_smollm2_cpu.json")
    if isinstance(ts, Mapping):
        for arm, d in (ts.get("paired_diff_vs_static") or {}).items():
            if _num(_get(d, "new", "mean")):
                rows.append((f"Adapting to shifted traffic ({arm}) minus the static drafter, held-out tau T0 after "
                             f"{_f(ts.get('shift_minutes'), 0)} min: new domains / old domains",
                             f"{_change(d.get('new'))} / {_change(d.get('old'))}", "traffic_shift_smollm2_cpu.json"))
    mj = results.get("main_job_smollm2_cpu.json")
    if isinstance(mj, Mapping) and _num(_get(mj, "paired_change", "new", "mean")):
        ch = mj["paired_change"]
        rows.append(("Main job (fresh clone): held-out tau T0 change after adapting live, new domains / old domains",
                     f"{_change(ch.get('new'))} / {_change(ch.get('old'))}", "main_job_smollm2_cpu.json"))
        if _get(ch, "old", "by_domain"):
            rows.append(("Main job: held-out tau T0 change per domain (every slice, paired 95% interval)",
                         _by_domain(ch), "main_job_smollm2_cpu.json"))
        if _speed(mj):
            rows.append(("Main job: output tokens/s on the new domains' held-out prompts, T0, one request at a time, "
                         "plain / start drafter / adapted drafter (goodput policy, same server)", _speed(mj),
                         "main_job_smollm2_cpu.json"))
    return rows
