"""Per-arm results in the run directory and their merge into the comparison's result (intervals, paired diffs).

Layout of ``RUN``: ``setup.json`` (what every arm must share: start drafter sha256, budget, evaluation prompts and
settings; a later invocation with other settings is refused), ``arms/<arm>.json`` (one finished arm: its
``per_request`` rows at T0 and T1, supervised tokens, wall time, config; written atomically, so a crash loses at
most the arm in progress), ``<arm>/`` (that arm's training run: metrics.jsonl, counters.json) and
``drafter-<arm>/`` (the trained drafter).

Intervals (:mod:`specopd_trainer.intervals`): per arm and temperature, tau per domain and their mean with a 95%
stratified bootstrap over prompts; per arm its paired difference to ``sft_continued`` on the same prompts.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from draft_opd_compare.arms import ARMS, BASELINE

TEMPS = ("T0", "T1")


class SetupMismatchError(ValueError):
    """The run directory holds arms measured with other settings (one line for the user)."""


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a temporary file beside it, then ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def check_setup(run_dir: Path, setup: Mapping[str, Any]) -> None:
    """Write ``RUN/setup.json`` the first time; later, raise :class:`SetupMismatchError` naming the keys whose value
    differs from the stored one (arms measured under other settings cannot be merged)."""
    path = Path(run_dir) / "setup.json"
    if not path.is_file():
        atomic_write_json(path, dict(setup))
        return
    old = json.loads(path.read_text())
    diff = sorted(k for k in set(old) | set(setup) if old.get(k) != setup.get(k))
    if diff:
        raise SetupMismatchError(f"{path} was made with other settings ({', '.join(diff)}); use another --run-dir "
                                 "or --fresh")


def arm_path(run_dir: Path, arm: str) -> Path:
    """``RUN/arms/<arm>.json``."""
    return Path(run_dir) / "arms" / f"{arm}.json"


def save_arm(run_dir: Path, arm: str, result: Mapping[str, Any]) -> Path:
    """Write one finished arm's result atomically; returns its path."""
    path = arm_path(run_dir, arm)
    atomic_write_json(path, {"arm": arm, **result})
    return path


def finished_arms(run_dir: Path) -> Dict[str, Dict[str, Any]]:
    """{arm: result} of every finished arm in ``RUN/arms/`` (known arms only, in :data:`ARMS` order)."""
    out = {}
    for arm in ARMS:
        p = arm_path(run_dir, arm)
        if p.is_file():
            out[arm] = json.loads(p.read_text())
    return out


def safe_part(fn, *args, **kw) -> Dict[str, Any]:
    """``fn(*args, **kw)``, or ``{"error": reason}`` when it raises ValueError (a part of a result that cannot be
    computed, e.g. a domain without verify steps, is reported rather than fatal)."""
    try:
        return fn(*args, **kw)
    except ValueError as exc:  # a domain without verify steps / no common prompts
        return {"error": str(exc)}


def assemble(results: Mapping[str, Mapping[str, Any]], domains: Sequence[str], *, n_boot: int = 2000
             ) -> Dict[str, Any]:
    """The comparison's measured part from finished arm results (each with ``per_request`` {T0, T1: rows of
    ``evaluate_acceptance``}, ``supervised_tokens``, ``wall_s``).

    Returns ``acceptance`` {arm: {T0, T1: acceptance_intervals}}, ``paired_diff_vs_sft_continued`` {arm: {T0, T1:
    paired_difference}} (every arm but the baseline; empty without the baseline), ``inside_noise`` {T0, T1: arms
    whose difference interval contains 0}, ``supervised_tokens``, ``supervised_tokens_per_s`` (training wall time;
    None for the untrained start) and ``wall_s`` per arm. A part that cannot be computed is ``{"error": reason}``.
    """
    from specopd_trainer.intervals import acceptance_intervals, paired_difference

    arms = [a for a in ARMS if a in results]
    acc = {a: {t: safe_part(acceptance_intervals, results[a]["per_request"][t], domains, n_boot=n_boot) for t in TEMPS}
           for a in arms}
    diffs: Dict[str, Any] = {}
    if BASELINE in results:
        base = results[BASELINE]["per_request"]
        diffs = {a: {t: safe_part(paired_difference, results[a]["per_request"][t], base[t], domains, n_boot=n_boot)
                     for t in TEMPS} for a in arms if a != BASELINE}
    noise = {t: [a for a in diffs if diffs[a][t].get("inside_noise")] for t in TEMPS}
    tokens = {a: int(results[a].get("supervised_tokens", 0)) for a in arms}
    wall = {a: results[a].get("wall_s") for a in arms}
    tps = {a: (tokens[a] / wall[a] if wall[a] and tokens[a] else None) for a in arms}
    return {"arms": arms, "acceptance": acc, "paired_diff_vs_sft_continued": diffs, "inside_noise": noise,
            "supervised_tokens": tokens, "supervised_tokens_per_s": tps, "wall_s": wall}


def floors(measured: Mapping[str, Any]) -> Dict[str, Any]:
    """The issue's floor: Draft-OPD's overall T0 tau above continued SFT's (point estimate), and whether that
    difference is outside the noise (its paired interval excludes 0). None when an arm is missing."""
    d = measured["paired_diff_vs_sft_continued"].get("draft_opd", {}).get("T0", {})
    if "mean" not in d:
        return {"draft_opd_beats_continued_sft_T0": None, "draft_opd_gain_outside_noise_T0": None}
    return {"draft_opd_beats_continued_sft_T0": d["mean"] > 0,
            "draft_opd_gain_outside_noise_T0": bool(d["ci95"][0] > 0)}


def missing_arms(selected: Sequence[str], results: Mapping[str, Any]) -> List[str]:
    """Arms of ``selected`` without a finished result."""
    return [a for a in selected if a not in results]


# what a result file must agree on with this run's setup before its arms are restored: (result key path, setup key)
_RESTORE_CHECKS = ((("start", "sha256"), "start_sha256"), (("budget_target_tokens",), "budget_tokens"),
                   (("eval", "limit_per_domain"), "eval_limit"), (("eval", "max_new_tokens"), "eval_max_new_tokens"),
                   (("references", "offset"), "refs_offset"), (("references", "per_domain"), "refs_per_domain"),
                   (("eval", "offset"), "val_offset"))
_ARM_KEYS = ("supervised_tokens", "steps", "config", "wall_s", "budget_fraction", "topups")


def restore_arms(run_dir: Path, result: Mapping[str, Any], setup: Mapping[str, Any]) -> List[str]:
    """Seed ``RUN/arms/`` from a committed result file of this comparison (run directories are not committed, so a
    new machine has only the result): every arm of ``result`` with ``per_request`` rows and no finished result in
    ``run_dir`` is written back as ``arms/<arm>.json`` (its rows, supervised tokens, steps, config, wall time,
    budget fraction, top-ups; ``restored_from`` the result's commit). Returns the restored arms in :data:`ARMS`
    order. Raises :class:`SetupMismatchError` naming the settings (start sha256, budget, evaluation prompts and
    length, references) on which the result differs from ``setup`` -- such arms cannot be merged."""
    diff = []
    for keys, name in _RESTORE_CHECKS:
        value: Any = result
        for k in keys:
            value = value.get(k) if isinstance(value, Mapping) else None
        if value != setup.get(name):
            diff.append(name)
    lr = result.get("lr")  # results before the LR options record theirs only in the arms' configs
    if isinstance(lr, Mapping):
        diff += [name for key, name in (("sft_continued", "lr_sft"), ("opd", "lr_opd"))
                 if lr.get(key) != setup.get(name)]
        if lr.get("specopd") != (setup.get("lr_specopd") or "recipe"):
            diff.append("lr_specopd")
    if diff:
        raise SetupMismatchError(f"the result to restore was made with other settings ({', '.join(diff)})")
    done = finished_arms(run_dir)
    rows = result.get("per_request") or {}
    restored = []
    for arm in ARMS:
        if arm in done or arm not in rows:
            continue
        rec = {k: (result.get(k) or {}).get(arm) for k in _ARM_KEYS if arm in (result.get(k) or {})}
        save_arm(run_dir, arm, {**rec, "per_request": rows[arm], "restored_from": result.get("git_commit")})
        restored.append(arm)
    return restored
