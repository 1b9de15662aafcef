"""Report pieces of the fleet benchmark (``fleet_smollm2_cpu.json``, ``benchmarks/fleet.py``): its summary item
(:mod:`.summary`) and headline row (:mod:`.headline`), formatted by the same helpers so that every
headline number appears in the item."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from sglang_specopd.app.bench.report.sections import _f, _num

Row = Tuple[str, str, str]
FILE = "fleet_smollm2_cpu.json"
FILES = (FILE, "fleet_c16_smollm2_cpu.json")  # the sweep; a rerun at concurrency 16 (items only)


def _ratio(value: Any, ci: Any) -> str:
    """``1.52x [1.41, 1.63]``, or ``-``."""
    if not _num(value):
        return "-"
    lo, hi = ci if isinstance(ci, (list, tuple)) and len(ci) == 2 else (float("nan"), float("nan"))
    return f"{value:.2f}x [{lo:.2f}, {hi:.2f}]"


def _scaling(data: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return sorted((s for s in data.get("scaling") or [] if isinstance(s, Mapping) and s.get("workers") == 2),
                  key=lambda s: s.get("concurrency", 0))


def _training_ratio(data: Mapping[str, Any]) -> Optional[str]:
    r = ((data.get("training") or {}).get("ratios") or {}).get("2_vs_1") or {}
    return _ratio(r.get("supervised_tokens_per_s_ratio"), r.get("ci95")) if r else None


def fleet_item(name: str, data: Mapping[str, Any]) -> List[str]:
    """The item: 2-vs-1 throughput per concurrency, ITL p99, training, rollouts and the kill -9 outcomes."""
    scaling = _scaling(data)
    if not scaling:
        return []
    levels = {(lv.get("workers"), lv.get("concurrency")): lv for lv in data.get("levels") or []}
    parts = [", ".join(f"c={s['concurrency']} {_ratio(s.get('throughput_ratio'), s.get('throughput_ratio_ci95'))}"
                       for s in scaling)]
    top = scaling[-1]["concurrency"]
    one, two = levels.get((1, top)) or {}, levels.get((2, top)) or {}
    parts.append(f"at c={top} {_f(one.get('output_tokens_per_s'), 1)} -> {_f(two.get('output_tokens_per_s'), 1)} "
                 f"tokens/s, ITL p99 {_f(one.get('itl_p99_s'), 3)} -> {_f(two.get('itl_p99_s'), 3)} s")
    runs = (data.get("training") or {}).get("workers") or {}
    if runs.get("1") and runs.get("2"):
        parts.append(f"SpecOPD supervised tokens/s {_f(runs['1'].get('supervised_tokens_per_s'), 0)} -> "
                     f"{_f(runs['2'].get('supervised_tokens_per_s'), 0)} ({_training_ratio(data)}, paired by step)")
    ro = data.get("rollout") or {}
    if ro:
        parts.append(f"{ro.get('committed')}/{ro.get('rollouts')} rollouts under load committed (stage "
                     f"{_f(ro.get('stage_s'), 2)} s, commit {_f(ro.get('commit_s'), 2)} s), "
                     f"{ro.get('stale_after_commit', 0) + ro.get('mixed_version_responses', 0)} stale or mixed "
                     f"responses after a commit (checked against `{ro.get('initial_version')}` before the first), "
                     f"{ro.get('errors_5xx')} 5xx")
    fl = data.get("floors") or {}
    if fl.get("kill_old_drafter_answers_after_commit") is not None:
        parts.append(f"kill -9 at a stage / commit: {fl['kill_old_drafter_answers_after_commit']} old-drafter answers "
                     f"after the commit, survivor on the expected version: {fl.get('kill_survivor_on_expected_version')}")
    lost = fl.get("training_kill_lost_steps")
    if lost is not None:
        parts.append(f"kill -9 during training: lost steps {sum(len(x) for x in lost)}")
    return [f"- **Fleet, 2 workers vs 1 behind sglang-router** (`{name}`, one core each, "
            f"{data.get('limit_per_domain')} prompts per domain, {data.get('max_new_tokens')} tokens, 2-vs-1 output "
            f"tokens/s paired by prompt): " + "; ".join(parts) + f"; {fl.get('levels_errors_5xx')} 5xx in the levels."]


def fleet_headline(results: Mapping[str, Mapping[str, Any]]) -> List[Row]:
    """The headline row from the newest of :data:`FILES` present (the rerun, else the sweep)."""
    name = next((f for f in reversed(FILES) if isinstance(results.get(f), Mapping) and _scaling(results[f])), None)
    if name is None:
        return []
    data = results[name]
    scaling = _scaling(data)
    ends = [scaling[0]] + ([scaling[-1]] if len(scaling) > 1 else [])
    value = ", ".join(f"c={s['concurrency']} {_ratio(s.get('throughput_ratio'), s.get('throughput_ratio_ci95'))}"
                      for s in ends)
    train = _training_ratio(data)
    what = "Fleet: 2 workers vs 1 (one core each) behind sglang-router, output tokens/s"
    if train:
        what += "; SpecOPD supervised tokens/s"
        value += f"; {train}"
    return [(what, value, name)]
