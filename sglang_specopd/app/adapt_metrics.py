"""``specopd adapt --metrics-port PORT``: the adapter's own Prometheus endpoint (``http://HOST:PORT/metrics``).

The adapter is a separate process (often on another machine than the server), so it exports its series itself with
prometheus-client's ``start_http_server`` rather than writing them into the server: Prometheus scrapes it as one
more target, and its series (``specopd:adapt_*``, :data:`sglang_specopd.server.metrics.series.ADAPTER_SERIES`) stay
up while the server restarts, and vanish (``up == 0``) when the adapter dies. They are read at scrape time from the
adapter's persisted state (:class:`specopd_trainer.adapt.state.AdaptState`: pushes, rollbacks, verdict counts,
the last verdict's time), so counters continue across a resumed run. docs/metrics.md.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, Optional

from sglang_specopd.server.metrics.series import ADAPTER_SERIES, MODEL_LABEL, exposed

_BY_SHORT = {s.name.split(":", 1)[1]: s for s in ADAPTER_SERIES}


class AdaptCollector:
    """A prometheus-client collector over ``state()`` (an AdaptState) with labels ``model_name`` and ``run``."""

    def __init__(self, state: Callable[[], Any], model_name: str, run: str, clock=time.time):
        self.state, self.labels, self.clock = state, {MODEL_LABEL: model_name, "run": run}, clock
        self.started = clock()

    def _family(self, short: str, extra: Optional[Dict[str, str]] = None):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = _BY_SHORT[short]
        cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
        return cls(s.name, s.help, labels=[*self.labels, *s.labels])

    def collect(self) -> Iterator[Any]:
        st = self.state()
        base = list(self.labels.values())
        for short, value in (("adapt_pushes", st.pushes), ("adapt_push_errors", st.push_errors),
                             ("adapt_rollbacks", st.rollbacks), ("adapt_train_steps", st.step)):
            fam = self._family(short)
            fam.add_metric(base, float(value))
            yield fam
        fam = self._family("adapt_guard_verdicts")
        counts = dict(getattr(st, "verdict_counts", None) or {})
        for kind in ("candidate", "deployed_vs_previous"):  # every series present from the start, at 0
            for outcome in ("deploy", "hold"):
                counts.setdefault(f"{kind}:{outcome}", 0)
        for key, n in sorted(counts.items()):
            kind, _, outcome = key.partition(":")
            fam.add_metric(base + [kind, outcome], float(n))
        yield fam
        last = getattr(st, "last_verdict_unix", None)
        fam = self._family("adapt_seconds_since_last_verdict")
        fam.add_metric(base, max(0.0, self.clock() - (last if last is not None else self.started)))
        yield fam
        fam = self._family("adapt_last_verdict_timestamp_seconds")
        fam.add_metric(base, float(last or 0.0))
        yield fam


def series_names() -> list:
    """The names a scrape of the adapter shows."""
    return [exposed(s) for s in ADAPTER_SERIES]


def serve_adapt_metrics(adapter: Any, port: int, model_name: str, host: str = "0.0.0.0"):
    """Start the adapter's ``/metrics`` on ``host:port`` (a daemon thread; a private registry, never the
    multiprocess one) for ``adapter`` (its ``state`` and ``run_dir``). Returns ``(server, thread)``; raises OSError
    when the port is taken."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    registry.register(AdaptCollector(lambda: adapter.state, model_name, adapter.run_dir.name))
    return start_http_server(port, addr=host, registry=registry)


def model_name_of(session: Any) -> str:
    """The ``model_name`` label for a session's server: its served model name (``/model_info``), else its path."""
    info = getattr(session, "model_info", None) or {}
    return str(info.get("served_model_name") or info.get("model_path") or getattr(session, "target", "") or "")
