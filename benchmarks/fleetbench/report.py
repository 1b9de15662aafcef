"""The fleet benchmark's floors (the issue's, as measured) and its printed summary."""

from __future__ import annotations

from typing import Any, Callable, Dict


def floors(payload: Dict[str, Any]) -> Dict[str, Any]:
    """The issue's floors and aim as measured here (None: not measured)."""
    levels, ro, faults = payload["levels"], payload.get("rollout"), payload.get("faults") or []
    kills = [f for f in faults if f.get("phase")]
    at16 = [s for s in payload.get("scaling") or [] if s["concurrency"] == 16 and s["workers"] == 2]
    return {
        "levels_errors_5xx": sum(lv["errors_5xx"] for lv in levels),
        "rollout_errors_5xx": None if ro is None else ro["errors_5xx"],
        "rollout_stale_or_mixed_after_commit": None if ro is None else ro["stale_after_commit"]
        + ro["mixed_version_responses"],
        "kill_old_drafter_answers_after_commit": sum(f["router_outside_rejoin"]["stale_after_commit"]
                                                     + f["router_outside_rejoin"]["mixed_after_commit"]
                                                     for f in kills) if kills else None,
        "kill_survivor_on_expected_version": all(
            f["survivor_serving"] == (f["version_rolled_out"] if f["committed"] else f["version_before"])
            for f in kills) if kills else None,
        "ratio_at_16_vs_aim_1_7": at16[0]["throughput_ratio"] if at16 else None,
        "training_kill_lost_steps": [f["lost_steps"] for f in faults if f.get("what") == "kill -9 worker during "
                                     "training"] or None,
        "training_supervised_ratio_2_vs_1": (payload["training"].get("ratios") or {}).get("2_vs_1"),
    }


def print_summary(payload: Dict[str, Any], say: Callable[[str], None]) -> None:
    for lv in payload["levels"]:
        ci = lv["output_tokens_per_s_ci95"] or [float("nan")] * 2
        say(f"{lv['workers']} worker(s) c={lv['concurrency']}: {lv['output_tokens_per_s']:.2f} tok/s "
            f"[{ci[0]:.2f}, {ci[1]:.2f}], ITL p99 {lv['itl_p99_s'] or float('nan'):.3f} s, 5xx {lv['errors_5xx']}")
    for s in payload["scaling"]:
        ci = s["throughput_ratio_ci95"] or [float("nan")] * 2
        ratio = s["throughput_ratio"] or float("nan")
        say(f"{s['workers']} vs {s['base_workers']} at c={s['concurrency']}: {ratio:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]")
    ro = payload.get("rollout")
    if ro:
        say(f"rollouts: {ro['committed']}/{ro['rollouts']} committed; stage {ro['stage_s'] or 0:.2f} s, commit "
            f"{ro['commit_s'] or 0:.2f} s, verify {ro['verify_s'] or 0:.2f} s (means); stale after commit "
            f"{ro['stale_after_commit']}, mixed {ro['mixed_version_responses']}, 5xx {ro['errors_5xx']}")
    for n, run in (payload["training"].get("workers") or {}).items():
        say(f"training on {n} worker(s): {run['supervised_tokens_per_s'] or float('nan'):.1f} supervised tokens/s "
            f"(exit {run['exit_code']}, {run['steps_logged']} steps)")
    for key, r in (payload["training"].get("ratios") or {}).items():
        say(f"training {key.replace('_', ' ')}: {r['supervised_tokens_per_s_ratio'] or float('nan'):.2f}x {r['ci95']}")
    for f in payload["faults"]:
        say(f"{f['what']}: {f['outcome']}")
    say(f"floors: {payload['floors']}")
