"""The plugin's Prometheus collectors in one server process, and the calls that move them.

SGLang (``--enable-metrics``) sets ``PROMETHEUS_MULTIPROC_DIR`` in the launcher before it starts the scheduler
(``sglang.srt.utils.common.set_prometheus_multiproc_dir``), so every process it starts writes its metrics to
mmap files there, and its ``/metrics`` route (``add_prometheus_middleware``: a ``MultiProcessCollector`` over that
directory) aggregates the files of all processes. SGLang's own scheduler collectors are plain prometheus-client
``Counter`` / ``Gauge`` / ``Histogram`` objects built in the scheduler after that (``SchedulerMetricsCollector``);
the plugin's are built the same way, lazily on their first use (prometheus-client decides at its import whether it
runs in multiprocess mode, so it is imported only then), and appear on the same ``/metrics``.

:func:`configure` turns recording on in a process (SGLang's ``server_args.enable_metrics``; in the scheduler only
on attention-TP rank 0, as SGLang's scheduler metrics); every ``record_*`` / ``set_*`` call is a no-op while it is
off and never raises (a metrics failure is logged once and recording stops: serving goes on).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, Optional, Sequence, Union

from sglang_specopd.server.metrics.series import MODEL_LABEL, SERVER_SERIES, Series

logger = logging.getLogger("sglang_specopd.server.metrics")

_STATE: Dict[str, Any] = {"enabled": False, "model": "", "registry": None, "metrics": None, "version": None}


def configure(server_args: Any = None, *, enabled: Optional[bool] = None, model_name: Optional[str] = None,
              registry: Any = None) -> bool:
    """Turn recording on or off in this process; returns whether it is on.

    Args:
        server_args: SGLang's ServerArgs: ``enable_metrics`` (unless ``enabled`` is given) and the ``model_name``
            label (``served_model_name``, else ``model_path``, as SGLang's own series).
        enabled / model_name: override what ``server_args`` says.
        registry: a prometheus-client ``CollectorRegistry`` (tests); None: the default one, as SGLang's collectors.
    """
    if enabled is None:
        enabled = bool(getattr(server_args, "enable_metrics", False))
    if model_name is None:
        model_name = getattr(server_args, "served_model_name", None) or getattr(server_args, "model_path", "") or ""
    _STATE.update(enabled=bool(enabled), model=str(model_name), registry=registry, metrics=None, version=None)
    return _STATE["enabled"]


def enabled() -> bool:
    return _STATE["enabled"]


def _build(series: Series, registry: Any):
    import prometheus_client as prom

    kw: Dict[str, Any] = {"labelnames": (MODEL_LABEL, *series.labels)}
    if registry is not None:
        kw["registry"] = registry
    if series.kind == "counter":
        return prom.Counter(series.name, series.help, **kw)
    if series.kind == "gauge":
        return prom.Gauge(series.name, series.help, multiprocess_mode=series.mode, **kw)
    return prom.Histogram(series.name, series.help, buckets=series.buckets, **kw)


def _child(short: str, **labels: Any):
    """The labelled child of series ``specopd:<short>`` (collectors built on the first call)."""
    if _STATE["metrics"] is None:
        _STATE["metrics"] = {s.name.split(":", 1)[1]: _build(s, _STATE["registry"]) for s in SERVER_SERIES}
    return _STATE["metrics"][short].labels(**{MODEL_LABEL: _STATE["model"]},
                                           **{k: str(v) for k, v in labels.items()})


def _safe(fn):
    def wrapper(*args, **kwargs):
        if not _STATE["enabled"]:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception:  # never let a metric stop a forward or a route
            logger.exception("specopd metrics: %s failed; recording is off from now on", fn.__name__)
            _STATE["enabled"] = False
            return None

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


@_safe
def touch(process: str = "scheduler") -> None:
    """Create the label-free series ``process`` records, at 0 (so that the first increment shows in ``rate``)."""
    for s in SERVER_SERIES:
        if s.process == process and not s.labels:
            _child(s.name.split(":", 1)[1])


@_safe
def record_verify(accepted: Sequence[int], drafted: Union[int, Sequence[int]]) -> None:
    """One verify step: per row (request), ``accepted[i]`` of ``drafted`` (or ``drafted[i]``) drafted tokens were
    accepted. Rows that verified no drafted token count nothing."""
    rows = [(int(a), int(d)) for a, d in zip(accepted, drafted if not isinstance(drafted, int)
                                             else [drafted] * len(accepted)) if int(d) > 0]
    if not rows:
        return
    width = max(d for _, d in rows)
    per_pos = [0] * width
    for a, d in rows:
        for p in range(max(0, min(a, d))):
            per_pos[p] += 1
    _child("spec_decode_num_drafts").inc(len(rows))
    _child("spec_decode_num_draft_tokens").inc(sum(d for _, d in rows))
    _child("spec_decode_num_accepted_tokens").inc(sum(per_pos))
    for p, n in enumerate(per_pos):
        _child("spec_decode_num_accepted_tokens_per_pos", position=p + 1).inc(n)  # inc(0) creates the series


@_safe
def record_policy_k(k: int) -> None:
    """One decode step of the goodput policy, which verified ``k`` drafts."""
    _child("spec_policy_k", k=int(k)).inc()


@_safe
def set_drafter_version(version: str) -> None:
    """The serving drafter is now ``version`` (its ``drafter_info`` 1, the previous version's 0)."""
    version = str(version)
    previous = _STATE["version"]
    if previous is not None and previous != version:
        _child("drafter_info", version=previous).set(0)
    _child("drafter_info", version=version).set(1)
    _STATE["version"] = version


DRAFTER_OPS = {"swap_drafter": "swap", "stage_drafter": "stage", "commit_drafter": "commit",
               "abort_drafter": "abort", "expire_drafter": "expire"}


@_safe
def record_control_op(op_name: str, status: int, payload: bytes = b"", request: bytes = b"") -> None:
    """A scheduler op (``request``: its payload) answered ``status`` and ``payload``: counted when it is a drafter
    op (:data:`DRAFTER_OPS`); a swap or commit that succeeded names the now serving version in its JSON reply
    (``hot_swap.install``); a traffic purge empties the spool."""
    if op_name == "traffic" and status == 200 and b'"purge"' in (request or b""):
        if json.loads(request).get("action") == "purge":
            set_spool_bytes(0)
    op = DRAFTER_OPS.get(op_name)
    if op is None:
        return
    outcome = "ok" if status < 400 else "refused" if status < 500 else "error"
    _child("drafter_ops", op=op, outcome=outcome).inc()
    if op in ("swap", "commit") and status == 200 and payload:
        version = json.loads(payload).get("version")
        if version is not None:
            set_drafter_version(version)


@_safe
def set_spool_bytes(n: int) -> None:
    """The live-traffic spool holds ``n`` bytes."""
    _child("traffic_spool_bytes").set(int(n))


@_safe
def score_arrived(depth: int) -> None:
    """A score_trees request arrived; ``depth`` requests are in the line."""
    _child("score_trees_requests").inc()
    _child("score_trees_queue_depth").set(int(depth))


@_safe
def score_answered(status: Optional[int], waited_s: Optional[float], depth: int) -> None:
    """A score_trees request was answered ``status`` (None: it raised) after waiting ``waited_s`` in the line
    (None: it never reached its turn); ``depth`` requests are left in the line."""
    if status is not None and 400 <= int(status) < 500:
        _child("score_trees_refusals", code=int(status)).inc()
    if waited_s is not None:
        _child("score_trees_queue_wait_seconds").observe(max(0.0, float(waited_s)))
    _child("score_trees_queue_depth").set(int(depth))
