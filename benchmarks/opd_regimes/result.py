"""The result of the OPD comparison: per regime and arm the counters, served tau (pooled over seeds, per domain, a
bootstrap interval over prompts) and the paired difference to continued SFT on the same prompts and seeds."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from opd_regimes.regimes import BASELINE, WALL_TOLERANCE, within_wall


def _sum(recs: Sequence[Mapping[str, Any]], key: str) -> float:
    return sum(r[key] for r in recs)


def arm_entry(recs: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]], domains: Sequence[str],
              budget: str) -> Dict[str, Any]:
    """One arm over its seeds (``recs``): wall_s / rows / tokens (mean over seeds), ``acceptance`` (``mean``,
    ``ci95`` and tau per domain of the pooled per-request rows) and ``paired_diff_vs_sft``."""
    from specopd_trainer.intervals import acceptance_intervals, paired_difference

    rows: List[dict] = [r for rec in recs for r in rec["per_request"]]
    base_rows: List[dict] = [r for rec in base for r in rec["per_request"]]
    acc = acceptance_intervals(rows, list(domains))
    n = len(recs)
    out = {"wall_s": _sum(recs, "wall_s") / n, "drafter_rows": _sum(recs, "drafter_rows") / n,
           "target_rows": _sum(recs, "target_rows") / n, "supervised_tokens": _sum(recs, "supervised_tokens") / n,
           "steps": _sum(recs, "steps") / n, "seeds": sorted(r["seed"] for r in recs),
           "stopped_by": sorted({str(r["stopped_by"]) for r in recs}),
           "acceptance": {"mean": acc["mean"], "ci95": acc["ci95"], **{d: acc[d] for d in domains},
                          "prompts": acc["prompts"]}}
    diff = paired_difference(rows, base_rows, list(domains))
    out["paired_diff_vs_sft"] = {"mean": diff["mean"], "ci95": diff["ci95"], "by_domain": diff["by_domain"]}
    if budget == "wall":
        out["wall_matched"] = all(within_wall(r["wall_s"], b["wall_s"]) for r in recs for b in base
                                  if b["seed"] == r["seed"])
    return out


def regime_entry(regime, records: Mapping[str, Sequence[Mapping[str, Any]]], plateau: Mapping[str, Any],
                 settings: Mapping[str, Any]) -> Dict[str, Any]:
    """``{temperature, arch, budget, why, plateau, arms: {arm: arm_entry}}`` (arms with at least one seed)."""
    base = records.get(BASELINE) or []
    arms = {arm: arm_entry(recs, base, regime.domains, regime.budget) for arm, recs in records.items()
            if recs and base}
    return {"temperature": regime.temperature, "arch": regime.arch, "budget": regime.budget,
            "domains": list(regime.domains), "why": regime.why, "plateau": dict(plateau), "arms": arms}


def assemble(entries: Mapping[str, Any], settings: Mapping[str, Any], missing: Sequence[str]) -> Dict[str, Any]:
    """The whole result (everything but the common header :func:`sglang_specopd.app.results.write_result` adds)."""
    wins = {f"{name} {arm}": a["paired_diff_vs_sft"] for name, e in entries.items() for arm, a in e["arms"].items()
            if arm != BASELINE and a["paired_diff_vs_sft"]["ci95"][0] > 0}
    return {"regimes": dict(entries), "opd_wins": wins, "arms_not_run": list(missing),
            "wall_tolerance": WALL_TOLERANCE, "settings": dict(settings),
            "served_tau": "SGLang's own per-request acceptance (completion tokens / verify steps) on held-out "
                          "prompts never spooled, at the regime's temperature; paired bootstrap 95% intervals over "
                          "prompts x seeds vs sft_continued"}
