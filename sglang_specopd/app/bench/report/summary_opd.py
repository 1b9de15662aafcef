"""Results-summary items of the Draft-OPD result files (the comparison of arms and the live-traffic run); part of
:func:`sglang_specopd.app.bench.report.summary.results_summary`, same rules: every number read from the file the
item names, a missing key leaves the item out."""

from __future__ import annotations

from typing import Any, List, Mapping

from sglang_specopd.app.bench.report.sections import _f, _int, _num, ci_text


def _draft_opd_comparison(name: str, data: Mapping[str, Any], *, list_missing: bool = True) -> List[str]:
    """The headline item of a Draft-OPD comparison file; ``list_missing=False`` for runs of a chosen subset of arms
    (the LR sweep), whose other arms are not "not run yet"."""
    acc = data.get("acceptance") or {}
    arms = [a for a in data.get("arms") or [] if _num(((acc.get(a) or {}).get("T0") or {}).get("mean"))]
    if not arms:
        return []
    diffs = data.get("paired_diff_vs_sft_continued") or {}

    def one(arm: str) -> str:
        t0, t1 = acc[arm]["T0"], (acc[arm].get("T1") or {})
        text = f"{arm} {ci_text(t0)}"
        d = (diffs.get(arm) or {}).get("T0") or {}
        if _num(d.get("mean")):
            noise = ", inside the noise" if d.get("inside_noise") else ""
            text += f" (vs continued SFT {ci_text(d, signed=True)}{noise})"
        return text + (f", T1 {_f(t1['mean'], 3)}" if _num(t1.get("mean")) else "")

    missing = (data.get("missing_arms") or []) if list_missing else []
    ev = data.get("eval") or {}
    if ev.get("split") == "validation":
        title, prompts = "Draft-OPD tuning sweep", (f"validation prompts (train split from {ev.get('offset', '?')}, "
                                                    f"not held out, {ev.get('limit_per_domain', '?')} per domain)")
    else:
        title, prompts = "Draft-OPD comparison", "held-out prompts"
    return [f"- **{title}** (`{name}`): served tau on {prompts} at T0 (mean of the 4 domains, 95% bootstrap "
            f"interval; paired difference to continued SFT on the same prompts), budget "
            f"{_int(data.get('budget_target_tokens'))} supervised draft tokens per arm from one SFT start"
            f"{_lrs(data.get('lr'))}: "
            + "; ".join(one(a) for a in arms) + (f". Not run yet: {', '.join(missing)}." if missing else ".")]


def _lrs(lr: Any) -> str:
    """", peak LR 1e-4 (specopd recipe)" from the result's ``lr`` map ({arm kind: LR or "recipe"}); "" if absent."""
    if not isinstance(lr, Mapping) or not lr:
        return ""
    vals = {k: (f"{v:g}" if _num(v) else str(v)) for k, v in lr.items()}
    if len(set(vals.values())) == 1:
        return f", peak LR {next(iter(vals.values()))} for every arm"
    return ", peak LR " + ", ".join(f"{k} {v}" for k, v in vals.items())


def _live_traffic(name: str, data: Mapping[str, Any]) -> List[str]:
    lt = data.get("live_traffic") or data
    if not _num(lt.get("tau_before")):
        return []
    return [f"- **Draft-OPD on live traffic** (`{name}`): {_f(lt.get('minutes'), 0)} min of traffic, "
            f"{_int(lt.get('requests_served'))} requests served, {lt.get('pushes', '?')} hot pushes, "
            f"{lt.get('serving_errors', '?')} serving errors; traffic tau {_f(lt.get('tau_before'), 3)} before training "
            f"-> {_f(lt.get('tau_after'), 3)} at the end{_change(data.get('tau_change'))} (different requests in each "
            "window: not a paired comparison)."]


def _change(d: Any) -> str:
    if not isinstance(d, Mapping) or not _num(d.get("mean")):
        return ""
    return f", change {ci_text(d, signed=True)}"
