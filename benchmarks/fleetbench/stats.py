"""The fleet benchmark's numbers, from raw records (pure functions: no server, no clock).

Throughput with intervals. A level sends every held-out prompt once with ``c`` requests in flight; its throughput is
``sum(completion tokens) / duration`` (``specopd bench serve``'s ``output_tokens_per_s``). That is exactly
``inflight * rate`` with ``inflight = sum(latency) / duration`` (the mean number of requests in flight, set by the
client) and ``rate = sum(tokens) / sum(latency)`` (tokens per second of request time). The bootstrap resamples
prompts for ``rate`` (stratified by domain, as :mod:`specopd_trainer.intervals` does for tau: every replicate keeps
each domain's prompt count; percentile intervals, :data:`~specopd_trainer.intervals.N_BOOT` replicates) with
``inflight`` held at its measured value, so the point estimate is the measured throughput. The 2-vs-1 ratio resamples
the SAME prompts for both arms (paired).

Drafter versions. Every ``/generate`` response of a SPECOPD worker carries ``meta_info["specopd_drafter_versions"]``:
the versions that drafted for it, in order. A response sent after the commit of version ``v`` had returned (the
fleet's commit step: the last worker's commit answered) may carry only ``v`` and versions committed later while it
was in flight (a commit whose first request was sent before the response ended): anything else is *stale* (one
version, an old one) or *mixed* (several, one of them old). Responses in flight across a commit carry two versions
legitimately (``spanning_commit``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from specopd_trainer.intervals import N_BOOT

_HTTP = re.compile(r"^HTTP (\d{3})\b")
MAX_EXAMPLES = 5


def _ok_rows(rows: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    return [r for r in rows if r["ok"]]


def _strata(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> Dict[str, np.ndarray]:
    """{domain: array [n_d, len(cols)]} of the rows' columns."""
    out: Dict[str, list] = {}
    for r in rows:
        out.setdefault(str(r.get("domain", "")), []).append([float(r[c]) for c in cols])
    return {d: np.asarray(v, dtype=np.float64) for d, v in sorted(out.items())}


def _boot_sums(strata: Mapping[str, np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Column sums of ``n_boot`` stratified resamples: [n_boot, n_cols]."""
    total = None
    for a in strata.values():
        idx = rng.integers(0, len(a), size=(n_boot, len(a)))
        s = a[idx].sum(axis=1)
        total = s if total is None else total + s
    return total


def _ci(samples: np.ndarray, level: float) -> List[float]:
    lo, hi = np.quantile(samples, [(1 - level) / 2, 1 - (1 - level) / 2])
    return [float(lo), float(hi)]


def throughput_interval(rows: Sequence[Mapping[str, Any]], duration_s: float, *, n_boot: int = N_BOOT,
                        seed: int = 0, level: float = 0.95) -> Dict[str, Any]:
    """Output tokens/s of one level with a bootstrap interval over prompts (see the module docstring).

    ``rows``: ``id``, ``domain``, ``ok``, ``completion_tokens``, ``latency_s`` per request; ``duration_s``: the
    level's wall time (> 0). Returns ``{"mean", "ci95", "prompts", "inflight"}``; ``ci95`` is None without a
    completed request. Raises ValueError for a non-positive duration.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = _ok_rows(rows)
    tokens = sum(float(r["completion_tokens"]) for r in ok)
    latency = sum(float(r["latency_s"]) for r in ok)
    point = tokens / duration_s
    if not ok or latency <= 0:
        return {"mean": point, "ci95": None, "prompts": len(ok), "inflight": None}
    inflight = latency / duration_s
    sums = _boot_sums(_strata(ok, ("completion_tokens", "latency_s")), n_boot, np.random.default_rng(seed))
    return {"mean": point, "ci95": _ci(inflight * sums[:, 0] / sums[:, 1], level), "prompts": len(ok),
            "inflight": inflight}


def paired_ratio_interval(arm: Sequence[Mapping[str, Any]], arm_duration_s: float,
                          base: Sequence[Mapping[str, Any]], base_duration_s: float, *, n_boot: int = N_BOOT,
                          seed: int = 0, level: float = 0.95) -> Dict[str, Any]:
    """Throughput of ``arm`` over that of ``base`` (same prompts, e.g. 2 workers vs 1 at one concurrency) with a
    paired bootstrap interval: the prompts both completed are resampled together (stratified by domain), each
    arm's in-flight mean held at its measured value. With every request completed the point is the ratio of the
    measured throughputs. Returns ``{"mean", "ci95", "prompts"}``. Raises ValueError without a common completed
    prompt or for a non-positive duration."""
    if arm_duration_s <= 0 or base_duration_s <= 0:
        raise ValueError("durations must be > 0")
    a = {str(r["id"]): r for r in _ok_rows(arm)}
    b = {str(r["id"]): r for r in _ok_rows(base)}
    ids = sorted(set(a) & set(b))
    if not ids:
        raise ValueError("no prompt completed in both arms")
    inflight_a = sum(float(r["latency_s"]) for r in a.values()) / arm_duration_s
    inflight_b = sum(float(r["latency_s"]) for r in b.values()) / base_duration_s
    joined = [{"domain": a[i].get("domain", ""), "ta": a[i]["completion_tokens"], "la": a[i]["latency_s"],
               "tb": b[i]["completion_tokens"], "lb": b[i]["latency_s"]} for i in ids]
    strata = _strata(joined, ("ta", "la", "tb", "lb"))
    full = np.concatenate(list(strata.values())).sum(axis=0)

    def ratio(s: np.ndarray) -> np.ndarray:
        return (inflight_a * s[..., 0] / s[..., 1]) / (inflight_b * s[..., 2] / s[..., 3])

    sums = _boot_sums(strata, n_boot, np.random.default_rng(seed))
    return {"mean": float(ratio(full)), "ci95": _ci(ratio(sums), level), "prompts": len(ids)}


def mean_interval(values: Sequence[float], *, n_boot: int = N_BOOT, seed: int = 0,
                  level: float = 0.95) -> Dict[str, Any]:
    """Mean, median, min, max of ``values`` (e.g. one rollout phase's seconds over repeated rollouts) with a
    bootstrap interval of the mean; ``{"n": 0}`` and Nones for no values."""
    x = np.asarray([float(v) for v in values if v is not None], dtype=np.float64)
    if not len(x):
        return {"n": 0, "mean": None, "ci95": None, "median": None, "min": None, "max": None}
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    return {"n": int(len(x)), "mean": float(x.mean()), "ci95": _ci(x[idx].mean(axis=1), level),
            "median": float(np.median(x)), "min": float(x.min()), "max": float(x.max())}


def http_status(error: Optional[str]) -> Optional[int]:
    """The HTTP status in a bench client error (``"HTTP 502: ..."``), else None (transport errors, timeouts)."""
    m = _HTTP.match(error or "")
    return int(m.group(1)) if m else None


def error_counts(statuses: Sequence[Optional[int]]) -> Dict[str, Any]:
    """``{"errors": n, "errors_5xx": n, "errors_by_status": {"502": n, "transport": n}}`` of failed requests'
    statuses (None: no HTTP status, e.g. the connection was refused or reset)."""
    by = Counter("transport" if s is None else str(s) for s in statuses)
    return {"errors": len(statuses), "errors_5xx": sum(1 for s in statuses if s is not None and 500 <= s < 600),
            "errors_by_status": dict(sorted(by.items()))}


def level_entry(workers: int, concurrency: int, rows: Sequence[Mapping[str, Any]], duration_s: float,
                summary: Mapping[str, Any], tau: Optional[Mapping[str, Any]] = None,
                decode_steps: Optional[Mapping[str, int]] = None) -> Dict[str, Any]:
    """One ``levels`` item (results.md: ``workers``, ``concurrency``, ``output_tokens_per_s``, ``itl_p99_s``,
    ``errors_5xx``) from the level's request rows, its duration and :func:`summarize_level`'s ``summary``; ``tau``:
    :func:`specopd_trainer.intervals.acceptance_intervals` of the level (or None); ``decode_steps``: per worker,
    the decode steps it ran during the level (how the router spread the load)."""
    thr = throughput_interval(rows, duration_s)
    errs = error_counts([http_status(r.get("error")) for r in rows if not r["ok"]])
    return {"workers": workers, "concurrency": concurrency, "output_tokens_per_s": thr["mean"],
            "output_tokens_per_s_ci95": thr["ci95"], "mean_inflight": thr["inflight"],
            "itl_p50_s": summary.get("itl_p50_s"), "itl_p99_s": summary.get("itl_p99_s"),
            "tpot_p50_s": summary.get("tpot_p50_s"), "ttft_p50_s": summary.get("ttft_p50_s"),
            "ttft_p99_s": summary.get("ttft_p99_s"), "requests": len(rows), "completed": len(_ok_rows(rows)),
            **errs, "error_messages": list(summary.get("error_messages") or []), "duration_s": duration_s,
            "tau": None if tau is None else {k: tau[k] for k in ("mean", "ci95") if k in tau},
            "spec_stats_missing": summary.get("spec_stats_missing"),
            "worker_decode_steps": dict(decode_steps) if decode_steps is not None else None,
            "rows": [{k: r.get(k) for k in ("id", "domain", "ok", "completion_tokens", "latency_s", "verify_ct")}
                     for r in rows]}


def scaling(levels: Sequence[Mapping[str, Any]], base_workers: int = 1) -> List[Dict[str, Any]]:
    """Per concurrency and per arm with more workers than ``base_workers``: its throughput over the base arm's
    (:func:`paired_ratio_interval` on the levels' ``rows``) and the ITL p99 of both. Levels without a base arm at
    their concurrency are left out."""
    base = {lv["concurrency"]: lv for lv in levels if lv["workers"] == base_workers}
    out = []
    for lv in levels:
        b = base.get(lv["concurrency"])
        if lv["workers"] == base_workers or b is None:
            continue
        try:
            r = paired_ratio_interval(lv["rows"], lv["duration_s"], b["rows"], b["duration_s"])
        except ValueError:
            r = {"mean": None, "ci95": None, "prompts": 0}
        out.append({"concurrency": lv["concurrency"], "workers": lv["workers"], "base_workers": base_workers,
                    "throughput_ratio": r["mean"], "throughput_ratio_ci95": r["ci95"], "prompts": r["prompts"],
                    "itl_p99_s": {str(base_workers): b["itl_p99_s"], str(lv["workers"]): lv["itl_p99_s"]}})
    return sorted(out, key=lambda x: (x["workers"], x["concurrency"]))


# ------------------------------------------------------------------------------------------------ drafter versions
def commit_windows(rollouts: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """``[{"version", "t_start", "t_end"}]`` of the committed rollouts (by commit end): ``t_start`` the first commit
    request sent, ``t_end`` the last commit reply (the fleet's commit step returned)."""
    out = [{"version": r["version"], "t_start": r["commit_window"][0], "t_end": r["commit_window"][1]}
           for r in rollouts if r.get("committed") and r.get("commit_window")]
    return sorted(out, key=lambda c: c["t_end"])


def version_check(samples: Sequence[Mapping[str, Any]], commits: Sequence[Mapping[str, Any]],
                  initial_version: Optional[str]) -> Dict[str, Any]:
    """Classify ``/generate`` responses by the drafter versions they carry (see the module docstring).

    ``samples``: ``t_send``, ``t_end``, ``ok``, ``status`` (HTTP status or None), ``versions`` (list); ``commits``:
    :func:`commit_windows`; ``initial_version``: what the fleet served before the first of them. Returns counts:
    ``responses``, ``completed``, ``after_commit`` (completed responses sent after a commit returned),
    ``stale_after_commit``, ``mixed_after_commit`` (the floors: 0), ``spanning_commit`` (two versions, in flight
    across a commit: expected), ``unexpected_before_commit`` (a version other than the initial one before any
    commit), ``no_version`` (completed without a verify step), :func:`error_counts`, and up to
    :data:`MAX_EXAMPLES` ``examples`` of the bad ones."""
    commits = sorted(commits, key=lambda c: c["t_end"])
    c = Counter()
    examples: List[Dict[str, Any]] = []
    failed = []
    for s in samples:
        if not s["ok"]:
            failed.append(s.get("status"))
            continue
        c["completed"] += 1
        vs = list(s.get("versions") or [])
        if not vs:
            c["no_version"] += 1
            continue
        k = max((i for i, cm in enumerate(commits) if cm["t_end"] <= s["t_send"]), default=-1)
        later = [cm["version"] for cm in commits[k + 1:] if cm["t_start"] <= s["t_end"]]
        allowed = {commits[k]["version"] if k >= 0 else initial_version, *later}
        fine = set(vs) <= allowed
        if len(set(vs)) > 1 and fine:
            c["spanning_commit"] += 1
        if k < 0:
            if not fine:
                c["unexpected_before_commit"] += 1
            continue
        c["after_commit"] += 1
        if not fine:
            kind = "stale_after_commit" if len(set(vs)) == 1 else "mixed_after_commit"
            c[kind] += 1
            if len(examples) < MAX_EXAMPLES:
                examples.append({"kind": kind, "versions": vs, "committed": commits[k]["version"],
                                 "sent_after_commit_s": s["t_send"] - commits[k]["t_end"],
                                 "target": s.get("target")})
    out = {"responses": len(samples)}
    for key in ("completed", "after_commit", "stale_after_commit", "mixed_after_commit", "spanning_commit",
                "unexpected_before_commit", "no_version"):
        out[key] = c[key]
    return {**out, **error_counts(failed), "examples": examples}


def rollout_timing(events: Sequence[Mapping[str, Any]], t_start: float, t_end: float) -> Dict[str, Any]:
    """Seconds of each phase of one rollout from its timed worker calls (``url``, ``op``: ``stage`` | ``commit`` |
    ``abort`` | ``verify``, ``t0``, ``t1``, ``ok``): a phase runs from its first call's start to its last call's end
    (stage: the lock worker alone, then the others in parallel). ``commit_window`` is ``[first commit sent, last
    commit answered]`` (None without commits); ``per_worker``: ``{url: {op: s}}``; ``total_s`` the whole call."""
    out: Dict[str, Any] = {"total_s": t_end - t_start, "per_worker": {}}
    for op in ("stage", "commit", "abort", "verify"):
        evs = [e for e in events if e["op"] == op]
        out[f"{op}_s"] = (max(e["t1"] for e in evs) - min(e["t0"] for e in evs)) if evs else None
        for e in evs:
            out["per_worker"].setdefault(e["url"], {})[f"{op}_s"] = e["t1"] - e["t0"]
    commits = [e for e in events if e["op"] == "commit"]
    out["commit_window"] = [min(e["t0"] for e in commits), max(e["t1"] for e in commits)] if commits else None
    return out


def rollout_summary(rollouts: Sequence[Mapping[str, Any]], checks: Mapping[str, Mapping[str, Any]],
                    *, concurrency: int) -> Dict[str, Any]:
    """The ``rollout`` section (results.md: ``stage_s``, ``commit_s``, ``under_load``, ``mixed_version_responses``,
    ``stale_after_commit``): per phase the mean with its bootstrap interval over the rollouts (and median / max),
    the version checks of every load target (``checks``: {target: :func:`version_check`}) and their totals."""
    committed = [r for r in rollouts if r.get("committed")]
    phases = {f"{p}_s": mean_interval([r.get(f"{p}_s") for r in committed]) for p in ("stage", "commit", "verify",
                                                                                       "total")}
    total = lambda key: sum(int(ch.get(key) or 0) for ch in checks.values())  # noqa: E731
    return {
        "rollouts": len(rollouts), "committed": len(committed), "verified": sum(1 for r in rollouts if r.get("ok")),
        **{k: v["mean"] for k, v in phases.items()}, "phases": phases, "under_load": True,
        "concurrency": concurrency, "stale_after_commit": total("stale_after_commit"),
        "mixed_version_responses": total("mixed_after_commit"), "spanning_commit_responses": total("spanning_commit"),
        "responses_after_commit": total("after_commit"), "errors_5xx": total("errors_5xx"), "errors": total("errors"),
        "checks": dict(checks), "per_rollout": [dict(r) for r in rollouts]}


def window(samples: Sequence[Mapping[str, Any]], t_from: Optional[float], t_to: Optional[float],
           inside: bool = True) -> List[Mapping[str, Any]]:
    """The samples sent inside ``[t_from, t_to]`` (or, ``inside=False``, outside it); all when ``t_from`` is None."""
    if t_from is None:
        return list(samples) if inside else []
    hit = lambda s: t_from <= s["t_send"] <= t_to  # noqa: E731
    return [s for s in samples if hit(s) == inside]


def in_flight_at(samples: Sequence[Mapping[str, Any]], t: float) -> List[Mapping[str, Any]]:
    """The samples sent before ``t`` that ended after it (in flight at ``t``)."""
    return [s for s in samples if s["t_send"] <= t <= s["t_end"]]


def with_base_commit(rollouts: Sequence[Mapping[str, Any]], initial: Optional[str],
                     t_base: float) -> List[Dict[str, Any]]:
    """:func:`commit_windows` of ``rollouts`` after a base commit of ``initial`` at ``t_base`` (the load's start):
    the version the fleet served when a phase began counts as committed before its first request, so a response
    with any older version (a restarted worker's start-up drafter) is stale too."""
    return [{"version": initial, "t_start": t_base, "t_end": t_base}] + commit_windows(rollouts)


def checks_by_target(samples: Sequence[Mapping[str, Any]], commits: Sequence[Mapping[str, Any]],
                     initial: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """:func:`version_check` of each load target's samples (``router``, ``direct:<worker url>``)."""
    labels = sorted({s["target"] for s in samples})
    return {lb: version_check([s for s in samples if s["target"] == lb], commits, initial) for lb in labels}


def fault_entry(*, phase: str, victim: str, survivor: str, rollout: Mapping[str, Any], t_kill: Optional[float],
                survivor_serving: Optional[str], initial: Optional[str], samples: Sequence[Mapping[str, Any]],
                rejoin: Optional[Mapping[str, Any]], t0: float, t_stop: float, concurrency: int,
                healthy_after: Optional[int]) -> Dict[str, Any]:
    """One ``faults`` item (results.md: ``what``, ``lost_steps``, ``lost_requests``, ``outcome``) of a rollout during
    which ``victim`` was killed just before its ``phase`` request (``t_kill``, None if the hook never ran).

    ``rollout``: the transaction's record (``version``, ``committed``, ``missed``, ``refused``, phase seconds,
    ``commit_window`` on the load's clock); ``samples``: the load's responses; ``rejoin``: the restart and
    reconcile of the victim (``restart_s``, ``reconcile_s``, ``reconciled``, ``serving``, ``error``, ``window``:
    [restart began, reconcile returned]) or None. Router responses sent inside the rejoin window are checked apart
    (``router_during_rejoin``): a restarted worker serves its start-up drafter until it is reconciled."""
    commits = with_base_commit([rollout], initial, t0)
    router = [s for s in samples if s["target"] == "router"]
    rw = list(rejoin["window"]) if rejoin else [None, None]
    lost = [s for s in router if not s["ok"]]
    e = {
        "what": f"kill -9 worker during rollout (at its {phase})", "phase": phase, "victim": victim,
        "survivor": survivor, "killed": t_kill is not None, "t_kill_s": None if t_kill is None else t_kill - t0,
        "committed": bool(rollout["committed"]), "missed": list(rollout.get("missed") or []),
        "refused": list(rollout.get("refused") or []), "survivor_serving": survivor_serving,
        "version_before": initial, "version_rolled_out": rollout["version"],
        "rollout": {k: rollout.get(k) for k in ("stage_s", "commit_s", "abort_s", "verify_s", "total_s",
                                                "per_worker")},
        "lost_steps": None, "lost_requests": len(lost),
        "lost_requests_in_flight_at_kill": None if t_kill is None else len(in_flight_at(lost, t_kill)),
        "router": version_check(router, commits, initial),
        "router_outside_rejoin": version_check(window(router, rw[0], rw[1], inside=False), commits, initial),
        "router_during_rejoin": version_check(window(router, rw[0], rw[1]), commits, initial) if rejoin else None,
        "direct": {lb: ch for lb, ch in checks_by_target(samples, commits, initial).items() if lb != "router"},
        "rejoin": None if rejoin is None else {**{k: v for k, v in rejoin.items() if k != "window"},
                                               "window_s": [x - t0 for x in rw]},
        "load_s": t_stop - t0, "concurrency": concurrency, "router_healthy_workers_after": healthy_after,
    }
    e["outcome"] = fault_outcome(e)
    return e


def fault_outcome(e: Mapping[str, Any]) -> str:
    """One sentence from a :func:`fault_entry`: what the transaction did, what the survivor serves, what the router
    answered (and, after a rejoin, what it answered while the restarted worker was reconciled)."""
    if not e["killed"]:
        head = f"the kill hook did not run (no {e['phase']} request reached the victim)"
    elif e["committed"]:
        head = (f"commit + reconcile: every stage had succeeded, so {e['version_rolled_out']} was committed; the "
                f"killed worker missed it ({'in report.missed' if e['victim'] in e['missed'] else 'NOT reported'})")
    else:
        head = f"abort everywhere: the killed worker's stage failed, so no worker changed ({e['version_before']})"
    want = e["version_rolled_out"] if e["committed"] else e["version_before"]
    verdict = "as it should" if e["survivor_serving"] == want else "WRONG"
    r = e["router_outside_rejoin"]
    old = r["stale_after_commit"] + r["mixed_after_commit"]
    out = (f"{head}; the survivor serves {e['survivor_serving']} ({verdict}); through the router {r['completed']} "
           f"answered, {e['lost_requests']} failed ({e['lost_requests_in_flight_at_kill']} in flight at the kill; "
           f"by status {e['router']['errors_by_status']}), {old} answered by an old drafter after the commit")
    if e["rejoin"] is not None:
        rj, during = e["rejoin"], e["router_during_rejoin"]
        ok = "ok" if rj["reconciled"] else f"FAILED: {rj.get('error')}"
        bad = during["stale_after_commit"] + during["mixed_after_commit"]
        out += (f"; restarted in {rj['restart_s']:.0f} s and reconciled to {rj['serving']} in "
                f"{rj['reconcile_s']:.2f} s ({ok}); while it rejoined, the router answered {bad} requests with an "
                f"old drafter")
    return out
