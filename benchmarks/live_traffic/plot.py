"""The live-traffic figure: tau of the served traffic per time window, with the hot pushes marked (top), and the
requests served per window (bottom)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def save_plot(result: Mapping[str, Any], path: Path) -> Path:
    """Draw ``result`` (the payload of :func:`live_traffic.stats.assemble_result`) to ``path`` (an earlier run's
    file moves to ``history/``); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    fig, (ax, ax_n) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    rows = result.get("windows") or []
    mid = [(w["t0_s"] + w["t1_s"]) / 120 for w in rows]
    ax.plot([m for m, w in zip(mid, rows) if w["tau"] is not None], [w["tau"] for w in rows if w["tau"] is not None],
            "o-", lw=1.2, ms=4, label=f"traffic tau per {result.get('window_s', 60):g} s window")
    before, after = result.get("before") or {}, result.get("after") or {}
    for span, colour, name in ((before, "grey", "before (warm-up, no trainer)"), (after, "tab:green", "after")):
        if span:
            ax.axvspan(span["start_s"] / 60, span["end_s"] / 60, color=colour, alpha=0.12)
            if span.get("tau") is not None:
                ax.hlines(span["tau"], span["start_s"] / 60, span["end_s"] / 60, colors=colour, lw=2,
                          label=f"{name}: tau {span['tau']:.3f}")
    for i, t in enumerate(result.get("push_times_s") or []):
        for a in (ax, ax_n):
            a.axvline(t / 60, color="tab:red", ls="--", lw=0.7, label="hot push" if (i == 0 and a is ax) else None)
    live = result.get("live_traffic") or {}
    ax.set_ylabel("tau (tokens / verify step)")
    ax.set_title(f"Draft-OPD on live traffic: {live.get('pushes', 0)} pushes, "
                 f"{live.get('serving_errors', 0)} serving errors, {live.get('requests_served', 0)} requests")
    ax.legend(fontsize=8, loc="best")
    ax_n.bar(mid, [w["requests"] for w in rows], width=0.8 * (result.get("window_s", 60) / 60), color="#4C72B0")
    ax_n.set_ylabel("served")
    ax_n.set_xlabel("time since the traffic started (min)")
    fig.tight_layout()
    out = save_figure(fig, path, dpi=120)
    plt.close(fig)
    return out
