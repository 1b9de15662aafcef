"""The deploy decision of ``specopd adapt``: every check a candidate must pass, each reported, none silently skipped.

:func:`judge` walks the candidate, the deployed drafter and the run's start drafter over the held-out requests
(:func:`specopd_trainer.adapt.guard.walk_rows`) and pushes the candidate only when ALL of these ran and passed:

- ``overall``: on the newest ``holdout_window`` held-out requests the rule of :func:`~.guard.compare` (``ci``: the
  paired 95% interval of candidate - deployed above ``min_gain``). Fewer than ``min_holdout`` requests: not run.
- ``older`` / ``older_vs_start``: on up to ``holdout_older`` held-out requests older than that window, the candidate
  is not worse (interval below 0) than the deployed drafter, nor than the start drafter (small losses per push
  cannot add up). Fewer than ``min_holdout`` older requests: not run, and that BLOCKS the push (a check that could
  not run is not a check that passed).
- ``slices`` / ``slices_vs_start``: per slice (:mod:`.slices`) of all held-out requests, non-inferiority: the paired
  95% lower bound of candidate - deployed (and - start) above ``-guard_margin``. A slice with fewer than
  ``guard_min_slice_items`` held-out requests is not judged (listed in ``not_judged``; it does not block: its
  requests still count in the older and overall checks).

The verdict (a dict noted in the state) carries every check with ``ran`` / ``passed``, the slices not judged, the
reason naming each failed or missing check, and ``pushed`` (the version) when it was deployed.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Sequence

from specopd_trainer.adapt.guard import compare, walk_rows, worse


def slice_checks(cand_rows: Sequence[dict], ref_rows: Sequence[dict], slice_of: Dict[str, str], *,
                 min_items: int, margin: float, seed: int = 0) -> Dict[str, Dict[str, Any]]:
    """Per slice: ``{"items", "ran", "passed", "diff", "ci95"}``; ``passed``: the 95% lower bound of (candidate -
    reference) above ``-margin``. A slice with fewer than ``min_items`` paired requests: ``ran`` False."""
    ref = {r["id"]: r for r in ref_rows}
    groups: Dict[str, List[tuple]] = {}
    for r in cand_rows:
        if r["id"] in ref:
            groups.setdefault(slice_of.get(r["id"], "other"), []).append((r, ref[r["id"]]))
    out = {}
    for name, pairs in sorted(groups.items()):
        if len(pairs) < min_items:
            out[name] = {"items": len(pairs), "ran": False, "passed": None,
                         "why": f"{len(pairs)} held-out requests < {min_items}: not judged"}
            continue
        v = compare([c for c, _ in pairs], [r for _, r in pairs], rule="ci", seed=seed)
        out[name] = {"items": len(pairs), "ran": True, "passed": bool(v.ci95[0] > -margin), "diff": v.diff,
                     "ci95": list(v.ci95)}
    return out


def _spread(seqs: List, n: int) -> List:
    """Up to ``n`` of ``seqs`` evenly spread over them (all when there are fewer)."""
    if n <= 0 or not seqs:
        return []
    if len(seqs) <= n:
        return list(seqs)
    return [seqs[int(i * len(seqs) / n)] for i in range(n)]


def judge(ad) -> Optional[Dict[str, Any]]:
    """Judge ``ad``'s candidate (an :class:`~specopd_trainer.adapt.loop.Adapter`), push or roll back; the verdict
    dict (also noted in ``ad.state``), or None when nothing is held out yet."""
    cfg, step = ad.cfg, ad.state.step
    everything = ad.hold_buf.sequences
    if not everything:
        return None
    hold = everything[-cfg.holdout_window:]
    if len(hold) < cfg.min_holdout:
        out = {"kind": "candidate", "step": step, "deploy": False, "ran": False, "requests": len(hold),
               "reason": f"not judged: {len(hold)} held-out requests < {cfg.min_holdout} (the overall check could "
                         f"not run)"}
        ad.state.note_verdict(out)
        return out
    dep_rows = walk_rows(ad.deployed, hold, ad._dep_cache)
    cand_rows = walk_rows(ad.drafter, hold)
    if not dep_rows or not cand_rows:
        return None
    v = compare(cand_rows, dep_rows, rule=cfg.deploy_rule, min_gain=cfg.min_gain, seed=step)
    ad.state.evaluations += 1
    out = {**v.as_dict(), "kind": "candidate", "step": step, "ran": True}
    failed: List[str] = [] if v.deploy else [f"overall {v.reason}"]
    if v.deploy:
        older = _spread(everything[:-cfg.holdout_window], cfg.holdout_older)
        judged = older + hold
        cand_all = walk_rows(ad.drafter, judged)
        refs = {"deployed": walk_rows(ad.deployed, judged, ad._dep_cache),
                "start": walk_rows(ad.anchor, judged, ad._start_cache)}
        older_ids = {s.id for s in older}
        for name, ref in refs.items():
            key = "older" if name == "deployed" else "older_vs_start"
            if len(older) < cfg.min_holdout:
                out[key] = {"ran": False, "passed": None, "requests": len(older),
                            "why": f"{len(older)} older held-out requests < {cfg.min_holdout}: could not run"}
                failed.append(f"the older-traffic check (vs the {name} drafter) could not run ({len(older)} older "
                              f"held-out requests < {cfg.min_holdout})")
            else:
                o = compare([r for r in cand_all if r["id"] in older_ids], [r for r in ref if r["id"] in older_ids],
                            rule="ci", seed=step)
                out[key] = {**o.as_dict(), "ran": True, "passed": not worse(o)}
                if worse(o):
                    failed.append(f"worse on older traffic than the {name} drafter [{o.ci95[0]:+.3f}, "
                                  f"{o.ci95[1]:+.3f}]")
        slice_of = {s.id: s.slice for s in judged}
        for name, ref in refs.items():
            key = "slices" if name == "deployed" else "slices_vs_start"
            out[key] = slice_checks(cand_all, ref, slice_of, min_items=cfg.guard_min_slice_items,
                                    margin=cfg.guard_margin, seed=step)
            for sl, c in out[key].items():
                if c["ran"] and not c["passed"]:
                    failed.append(f"worse on slice {sl} than the {name} drafter (lower bound {c['ci95'][0]:+.3f} "
                                  f"<= -{cfg.guard_margin:g})")
        out["not_judged"] = sorted(sl for sl, c in out["slices"].items() if not c["ran"])
    deploy = not failed
    out.update(deploy=deploy, reason=v.reason if deploy else "; ".join(failed))
    if deploy and out.get("not_judged"):
        out["reason"] += f" (slices not judged, too few held-out requests: {', '.join(out['not_judged'])})"
    ad.state.note_verdict(out)
    if deploy:
        version = ad.next_version()
        if ad.deploy_candidate(version, f"candidate {out['reason']}"):
            out["pushed"] = version
    elif cfg.rollback and ad.previous is not None and len(ad.state.deployed) > 1:
        rollback_check(ad, hold, dep_rows)
    return out


def rollback_check(ad, hold, dep_rows) -> None:
    """The deployed drafter against the one before it on ``hold``; pushed back when measured worse."""
    prev = copy.deepcopy(ad.deployed)
    prev.load_state_dict(ad.previous)
    back = compare(dep_rows, walk_rows(prev, hold), rule="ci", seed=ad.state.step)
    rec = {**back.as_dict(), "kind": "deployed_vs_previous", "step": ad.state.step, "rolled_back": False}
    ad.state.note_verdict(rec)
    if worse(back):
        version = f"{ad.state.deployed[-2]['version']}-rollback"
        if ad._push(prev, version, f"rollback: deployed vs previous {back.reason}"):
            ad.deployed.load_state_dict(ad.previous)
            ad.previous = None
            ad._dep_cache.clear()
            ad.state.rollbacks += 1
            rec.update(rolled_back=True, pushed=version)
            ad._reset_candidate("rollback")
