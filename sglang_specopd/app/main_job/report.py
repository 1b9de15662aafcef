"""The main job's summary (a JSON-able dict; the shape of ``main_job_smollm2_cpu.json`` in the shared results notes)
and the lines ``specopd main`` prints from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional


def _group(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    """Intervals before / after and the paired change for one group of domains (evaluate results, same prompts)."""
    from specopd_trainer.intervals import acceptance_intervals, paired_difference

    domains = [d for d in before["per_domain"] if before["per_domain"][d]["verify_steps"]
               and after["per_domain"].get(d, {}).get("verify_steps")]
    return {"domains": domains,
            "before": acceptance_intervals(before["per_request"], domains),
            "after": acceptance_intervals(after["per_request"], domains),
            "change": paired_difference(after["per_request"], before["per_request"], domains)}


def summary(cfg, *, before, after, adapted: Dict[str, Any], served: List, serving: Dict[str, Any],
            chat: Dict[str, Any], saved: Optional[Path], timings: Dict[str, float], run_dir: Path,
            start_drafter: Optional[str], speed: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Everything the main job measured and decided (see the module docstring)."""
    new, old = _group(before["new"], after["new"]), _group(before["old"], after["old"])
    deployed = "adapted" if adapted["pushes"] and serving.get("version") == adapted["deployed_version"] else "start"
    last = adapted["deployed"][-1]
    cands = [v for v in adapted["verdicts"] if v.get("kind") == "candidate" and v.get("ci95")]  # judged ones
    if deployed == "adapted":
        reason = f"{last['why']} (step {last['step']}, {last['t_s']:.0f} s into the traffic)"
    elif cands:
        best = max(cands, key=lambda v: v["ci95"][0])
        reason = (f"no candidate was deployed; the best overall interval [{best['ci95'][0]:+.3f}, "
                  f"{best['ci95'][1]:+.3f}] at step {best['step']} was refused: {best.get('reason', '-')}")
    else:
        reason = "no candidate was judged (too little held-out traffic)"
    meta = chat.get("meta_info") or {}
    errors = [r.error for r in served if r.error is not None]
    return {
        "config": cfg.model_dump(mode="json"), "wall_s": timings.get("total_s"), "timings": timings,
        "start_drafter": start_drafter, "new_domains": list(cfg.new_domains), "old_domains": list(cfg.old_domains),
        "before": {"new": new["before"], "old": old["before"]}, "after": {"new": new["after"], "old": old["after"]},
        "paired_change": {"new": new["change"], "old": old["change"]},
        "per_request": {"before": {"new": before["new"]["per_request"], "old": before["old"]["per_request"]},
                        "after": {"new": after["new"]["per_request"], "old": after["old"]["per_request"]}},
        "deployed": deployed, "serving_version": serving.get("version"), "reason": reason,
        "saved_drafter": str(saved) if saved else None,
        "traffic": {"requests": len(served), "completion_tokens": sum(r.completion_tokens for r in served),
                    "errors": len(errors), "errors_5xx": sum(1 for e in errors if e.isdigit() and e.startswith("5")),
                    "streams": cfg.streams, "max_tokens": cfg.traffic_max_tokens, "old_minutes": cfg.old_minutes,
                    "old_share": cfg.old_share,
                    "minutes": cfg.traffic_minutes},
        "adapt": {k: adapted[k] for k in ("step", "pushes", "rollbacks", "push_errors", "candidate_resets",
                                          "traffic_tokens_seen", "traffic_tokens_trained", "trained_tokens",
                                          "train_items", "holdout_items", "reader", "features", "deployed",
                                          "verdicts", "timings_s", "stopped_by")},
        "run_dir": str(run_dir),
        "speed": speed,
        "chat": {"reply": (chat.get("message") or {}).get("content"),
                 **{k: meta.get(k) for k in ("completion_tokens", "spec_verify_ct", "spec_accept_length",
                                             "specopd_drafter_versions")}},
    }


def change_line(label: str, change: Dict[str, Any]) -> str:
    """``new domains (japanese, wordsort): +0.412 [+0.301, +0.530], paired bootstrap 95% interval over 48 prompts:
    a gain``."""
    lo, hi = change["ci95"]
    n = sum(change["prompts"].values())
    verdict = "inside the noise" if change["inside_noise"] else ("a gain" if change["mean"] > 0 else "a loss")
    return (f"{label} ({', '.join(change['prompts'])}): {change['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}], paired "
            f"bootstrap 95% interval over {n} prompts: {verdict}")


def deployed_line(res: Dict[str, Any]) -> str:
    """What serves now, and why (never calls the shipped drafter "redeployed")."""
    if res["deployed"] == "adapted":
        return f"deployed: the adapted drafter, version {res['serving_version']!r}: {res['reason']}"
    return f"deployed: still the shipped drafter (version {res['serving_version']!r}): {res['reason']}"


def format_timings(timings: Dict[str, float]) -> str:
    """``{"server_start_s": 45.2, "eval_before_s": 95.0}`` -> ``server_start 45 s, eval_before 95 s``."""
    return ", ".join(f"{k[:-2] if k.endswith('_s') else k} {v:.0f} s" for k, v in timings.items()) or "-"


def speed_line(speed: Optional[Dict[str, Any]]) -> str:
    """``speed on the new domains' held-out prompts (T=0, one request at a time): plain 30.1, start drafter 28.0,
    adapted drafter 36.2 tokens/s; adapted / plain 1.20x [1.10, 1.31] over 24 prompts``."""
    if not speed:
        return "speed: not measured (--speed-prompts 0)"
    r = speed["ratios"]["adapted_over_plain"]
    return (f"speed on the new domains' held-out prompts (T=0, one request at a time): plain {speed['plain']:.1f}, "
            f"start drafter {speed['start']:.1f}, adapted drafter {speed['adapted']:.1f} tokens/s; adapted / plain "
            f"{r['mean']:.2f}x [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] over {r['prompts']} prompts")
