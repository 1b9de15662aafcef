"""Where a fleet benchmark level's CPU went: each worker's process tree, the router, the client (this process) and
the rest of the machine, in cores used over the level (CPU seconds / wall seconds, from psutil)."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional


def _tree_cpu_s(pid: Optional[int]) -> Optional[float]:
    """User + system CPU seconds of process ``pid`` and its live descendants (None when it is gone)."""
    import psutil

    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def cpu_seconds(fleet) -> Dict[str, Optional[float]]:
    """CPU seconds so far of each worker (its process tree), the router, this process (the client) and the whole
    machine (busy time of every core), for where a level's CPU went (:func:`cpu_split`)."""
    import psutil

    out = {f"worker{i}": _tree_cpu_s(w.proc.pid if w.proc is not None else None) for i, w in enumerate(fleet.workers)}
    router = getattr(fleet, "router", None)
    out["router"] = _tree_cpu_s(router.proc.pid if router is not None and router.proc is not None else None)
    me = psutil.Process().cpu_times()
    out["client"] = me.user + me.system
    m = psutil.cpu_times()
    out["machine_busy"] = m.user + m.nice + m.system + getattr(m, "irq", 0.0) + getattr(m, "softirq", 0.0)
    return out


def cpu_split(before: Dict[str, Optional[float]], after: Dict[str, Optional[float]],
              duration_s: float) -> Dict[str, Any]:
    """Cores used over a level by each part (CPU seconds / wall seconds; None where a part was not measurable),
    and ``other``: the machine's busy cores not accounted for by the parts."""
    used = {k: (after[k] - before[k]) / duration_s if after.get(k) is not None and before.get(k) is not None
            and duration_s > 0 else None for k in before}
    parts = [v for k, v in used.items() if k != "machine_busy" and v is not None]
    if used.get("machine_busy") is not None:
        used["other"] = used["machine_busy"] - sum(parts)
    return {"cores_used": used, "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count()}
