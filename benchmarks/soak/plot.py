"""The soak's figure: scheduler RSS over time (left) and serving ITL p99 against supervised tokens/s (right)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def save_plot(result: Mapping[str, Any], path: Path) -> Path:
    """Draw ``result`` (the soak payload, ``curve`` may be empty) to ``path`` (an earlier run's file moves to
    ``history/``); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    fig, (ax_rss, ax_curve) = plt.subplots(1, 2, figsize=(11, 3.8))
    rss = result.get("rss_mb") or []
    ax_rss.plot([t / 60 for t, _ in rss], [mb for _, mb in rss], lw=1)
    for name, style in (("idle", ":"), ("training", "--")):
        for t in (result.get("windows_s") or {}).get(name, []):
            ax_rss.axvline(t / 60, ls=style, c="grey", lw=0.8)
    ax_rss.set_xlabel("soak time (min)")
    ax_rss.set_ylabel("scheduler RSS (MiB)")
    ax_rss.set_title(f"scheduler RSS (growth {_pct(result.get('rss_growth_fraction'))} after warm-up)")
    points = [p for p in result.get("curve") or [] if p.get("itl_p99_s") is not None]
    for p in points:
        x, y = p["supervised_tokens_per_s"], 1e3 * p["itl_p99_s"]
        ax_curve.plot([x], [y], "o")
        ax_curve.annotate(f"budget {p['budget'] or 'unbounded'}", (x, y), textcoords="offset points", xytext=(4, 4),
                          fontsize=8)
    idle = (result.get("itl_p99_s") or {}).get("idle")
    if idle is not None:
        ax_curve.axhline(1e3 * idle, ls=":", c="grey", lw=0.8, label="idle (load alone)")
        ax_curve.axhline(2e3 * idle, ls="--", c="red", lw=0.8, label="floor: 2 x idle")
        ax_curve.legend(fontsize=8)
    ax_curve.set_xlabel("trainer supervised tokens / s")
    ax_curve.set_ylabel("serving ITL p99 (ms)")
    ax_curve.set_title("serving latency vs training throughput" if points else "no curve points")
    fig.tight_layout()
    out = save_figure(fig, path, dpi=120)
    plt.close(fig)
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"
