"""The traffic-shift result file (keys in the shared results notes, ``traffic_shift_smollm2_cpu.json``)."""

from __future__ import annotations

from typing import Any, Dict, List

ARM_KEYS = {None: "static", "sft": "sft_from_traffic", "draft-opd": "draft_opd_from_traffic",
            "specopd": "specopd_from_traffic", "auto": "auto_from_traffic"}


def arm_key(algorithm) -> str:
    """The result key of an arm (``static`` for no algorithm)."""
    return ARM_KEYS.get(algorithm, f"{algorithm}_from_traffic")


def paired_vs_static(arms: Dict[str, Any]) -> Dict[str, Any]:
    """``{arm: {"new": paired_difference, "old": ...}}`` of every adapted arm's final tau minus the static arm's, on
    the same held-out prompts (paired bootstrap over prompts)."""
    from specopd_trainer.intervals import paired_difference

    if "static" not in arms:
        return {}
    out = {}
    for name, arm in arms.items():
        if name == "static":
            continue
        out[name] = {}
        for group in ("new", "old"):
            mine, base = arm["final"][group], arms["static"]["final"][group]
            domains = [d for d in mine["T0"]["prompts"] if d in base["T0"]["prompts"]]
            out[name][group] = paired_difference(mine["per_request"], base["per_request"], domains)
    return out


def errors_5xx(arms: Dict[str, Any]) -> int:
    return sum(a["load_all"]["errors_5xx"] for a in arms.values())


def itl_p99(arms: Dict[str, Any]) -> Dict[str, Any]:
    """ITL p99 during the shift: without an adapter (the static arm) and with one (each adapted arm, and the worst)."""
    adapted = {k: a["itl_shift_s"]["p99"] for k, a in arms.items() if k != "static"}
    vals = [v for v in adapted.values() if v is not None]
    return {"no_adapter": arms.get("static", {}).get("itl_shift_s", {}).get("p99"),
            "adapter": max(vals) if vals else None, "by_arm": adapted}


def assemble(settings: Dict[str, Any], arms: Dict[str, Any], feature: Dict[str, Any] | None,
             sources: Dict[str, str]) -> Dict[str, Any]:
    """The whole result (everything but the common header)."""
    return {"new_domains": {d: sources[d] for d in settings["new_domains"]}, "old_domains": settings["old_domains"],
            "shift_minutes": settings["shift_minutes"], "old_minutes": settings["old_minutes"],
            "load": {"streams": settings["streams"], "temperature": 0, "max_new_tokens": settings["max_tokens"],
                     "api": "/v1/chat/completions, streamed"},
            "eval": {"curve_prompts_per_domain": settings["curve_per_domain"],
                     "final_new_prompts_per_domain": settings["eval_new"],
                     "final_old_prompts_per_domain": settings["eval_old"],
                     "max_new_tokens": settings["eval_max_new_tokens"], "temperature": 0},
            "arms": arms, "paired_diff_vs_static": paired_vs_static(arms), "errors_5xx": errors_5xx(arms),
            "itl_p99_s": itl_p99(arms), "features_captured_while_serving": bool(settings["capture"]),
            "feature_cost": feature, "settings": settings}


def missing_arms(settings: Dict[str, Any], done: Dict[str, Any]) -> List[str]:
    return [a for a in settings["arms"] if arm_key(None if a == "static" else a) not in done]
