"""``specopd fleet status``: each worker's health, drafter version and traffic spool, and the router's readiness.

Read from the state file (which processes, which URLs) and asked of each process over HTTP, in parallel:

* worker health: ``GET /health`` (200 = the HTTP server and scheduler answer);
* drafter: ``GET /specopd/drafter`` (version, swaps, name, a staged rollout transaction; the ``--api-key`` when the
  workers have one);
* spool: ``GET /specopd/traffic?max_items=1`` with the admin key -> its ``stats`` (items, bytes, budget, ...);
  ``off`` when the worker has no spool (409), ``admin key needed`` without the key;
* router: ``GET /readiness`` (healthy / total workers as the router sees them).

``ok`` is true when the router is ready with every worker healthy and all workers serve the same drafter version.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

from sglang_specopd.app.fleet.plan import FleetError
from sglang_specopd.app.launch.pinning import cpu_list
from sglang_specopd.app.fleet.state import ProcessRecord, group_pids, is_alive, read_state
from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH
from sglang_specopd.wire.traffic import TRAFFIC_PATH


def _get(url: str, key: Optional[str], timeout: float, params: Optional[dict] = None):
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.get(url, headers=headers, params=params, timeout=timeout)
    except httpx.HTTPError as exc:
        return exc


def _reason(r) -> str:
    if isinstance(r, Exception):
        return f"unreachable ({type(r).__name__})"
    return f"HTTP {r.status_code}: {r.text[:120]}"


def worker_status(rec: ProcessRecord, api_key: Optional[str], admin_key: Optional[str],
                  timeout: float = 5.0) -> Dict[str, Any]:
    """One worker's line of :func:`fleet_status`."""
    out: Dict[str, Any] = {"index": rec.index, "url": rec.url, "pid": rec.pid, "running": bool(group_pids(rec)),
                           "cores": list(rec.cores) if rec.cores else None, "log": rec.log}
    health = _get(rec.url + "/health", None, timeout)
    out["healthy"] = not isinstance(health, Exception) and health.status_code == 200
    info = _get(rec.url + DRAFTER_INFO_PATH, api_key, timeout)
    if not isinstance(info, Exception) and info.status_code == 200:
        d = info.json()
        out["drafter"] = {k: d.get(k) for k in ("version", "swaps", "name", "architecture", "staged")}
    else:
        out["drafter"] = {"error": _reason(info)}
    spool = _get(rec.url + TRAFFIC_PATH, admin_key, timeout, params={"max_items": 1}) if admin_key else None
    if spool is None:
        out["spool"] = {"state": "admin key needed"}
    elif not isinstance(spool, Exception) and spool.status_code == 200:
        out["spool"] = {"state": "on", **spool.json().get("stats", {})}
    elif not isinstance(spool, Exception) and spool.status_code == 409:
        out["spool"] = {"state": "off"}
    else:
        out["spool"] = {"state": "error", "error": _reason(spool)}
    return out


def fleet_status(run_dir: str | os.PathLike[str], api_key: Optional[str] = None, admin_key: Optional[str] = None,
                 timeout: float = 5.0) -> Dict[str, Any]:
    """The status of the fleet in ``run_dir`` as a JSON-able dict (see the module docstring).

    Raises:
        FleetError: no fleet state in ``run_dir``.
    """
    from sglang_specopd.app.fleet.router import router_readiness

    state = read_state(run_dir)
    if state is None:
        raise FleetError(f"no fleet in {run_dir} (no fleet.json)")
    with ThreadPoolExecutor(max_workers=max(1, len(state.workers)) + 1) as pool:
        futures = [pool.submit(worker_status, w, api_key, admin_key, timeout) for w in state.workers]
        ready = pool.submit(router_readiness, state.router_url, timeout)
        workers = [f.result() for f in futures]
        readiness = ready.result()
    router = {"url": state.router_url, "pid": state.router.pid if state.router else None,
              "running": bool(state.router and group_pids(state.router)), "readiness": readiness}
    versions = sorted({w["drafter"].get("version") for w in workers if "version" in w["drafter"]})
    ok = (bool(workers) and readiness is not None and readiness.get("http_status") == 200
          and readiness.get("healthy_workers") == len(workers) and all(w["healthy"] for w in workers)
          and len(versions) == 1 and all("version" in w["drafter"] for w in workers))
    return {"run_dir": str(run_dir), "status": state.status, "config": state.config, "message": state.message,
            "supervisor": {"pid": state.supervisor.pid, "running": is_alive(state.supervisor)},
            "router": router, "workers": workers, "drafter_versions": versions, "ok": ok}


def status_lines(status: Dict[str, Any]) -> List[str]:
    """The human-readable form of :func:`fleet_status`."""
    sup = status["supervisor"]
    lines = [f"fleet {status['run_dir']}: {status['status']} (config {status['config']}; supervisor pid {sup['pid']}"
             f"{'' if sup['running'] else ', not running'})" + (f"; {status['message']}" if status["message"] else "")]
    r = status["router"]
    rd = r["readiness"]
    if rd is None:
        ready = "not answering"
    else:
        ready = f"{rd.get('status', 'HTTP ' + str(rd.get('http_status')))}, {rd.get('healthy_workers', '?')}/" \
                f"{rd.get('total_workers', '?')} workers healthy"
    lines.append(f"router   {r['url']}  pid {r['pid']}  {ready}")
    for w in status["workers"]:
        d = w["drafter"]
        drafter = (f"drafter {d['version']} (swaps {d['swaps']}" + (f", staged {d['staged']['version']}"
                   if d.get("staged") else "") + ")") if "version" in d else f"drafter ? ({d['error']})"
        s = w["spool"]
        spool = (f"spool {s['items']} items, {s['bytes']}/{s['budget_bytes']} bytes, {s['recorded']} recorded"
                 if s["state"] == "on" else f"spool {s['state']}" + (f" ({s['error']})" if s.get("error") else ""))
        cores = f"  cores {cpu_list(w['cores'])}" if w["cores"] else ""
        lines.append(f"worker {w['index']} {w['url']}  pid {w['pid']}  {'healthy' if w['healthy'] else 'UNHEALTHY'}"
                     f"  {drafter}  {spool}{cores}")
    versions = status["drafter_versions"]
    lines.append("ok: every worker healthy, one drafter version" if status["ok"] else
                 f"NOT ok (drafter versions {versions or 'unknown'})")
    return lines
