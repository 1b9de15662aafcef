"""The fleet benchmark's plot: throughput per arm vs concurrency, the scaling ratio and ITL p99, with intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

AIM = 1.7  # issue 39: 2 workers (one core each) >= 1.7x one worker at concurrency 16


def plot(payload: Mapping[str, Any], path: Path) -> Path:
    """Three panels: output tokens/s by concurrency per worker count (95% intervals over prompts), the paired
    ratio to one worker (with the aim), ITL p99. Written with :func:`save_figure` (an earlier plot goes to
    history/)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    levels = payload.get("levels") or []
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 3.8))
    for n in sorted({lv["workers"] for lv in levels}):
        rows = sorted((lv for lv in levels if lv["workers"] == n), key=lambda lv: lv["concurrency"])
        xs = [lv["concurrency"] for lv in rows]
        ys = [lv["output_tokens_per_s"] for lv in rows]
        ci = [lv.get("output_tokens_per_s_ci95") or [y, y] for lv, y in zip(rows, ys)]
        axes[0].errorbar(xs, ys, yerr=[[y - c[0] for y, c in zip(ys, ci)], [c[1] - y for y, c in zip(ys, ci)]],
                         marker="o", capsize=3, label=f"{n} worker{'s' if n > 1 else ''}")
        axes[2].plot(xs, [lv["itl_p99_s"] for lv in rows], marker="o", label=f"{n} worker{'s' if n > 1 else ''}")
    for n in sorted({s["workers"] for s in payload.get("scaling") or []}):
        rows = sorted((s for s in payload["scaling"] if s["workers"] == n and s["throughput_ratio"] is not None),
                      key=lambda s: s["concurrency"])
        xs, ys = [s["concurrency"] for s in rows], [s["throughput_ratio"] for s in rows]
        ci = [s.get("throughput_ratio_ci95") or [y, y] for s, y in zip(rows, ys)]
        axes[1].errorbar(xs, ys, yerr=[[y - c[0] for y, c in zip(ys, ci)], [c[1] - y for y, c in zip(ys, ci)]],
                         marker="o", capsize=3, label=f"{n} vs {rows[0]['base_workers'] if rows else 1}")
    axes[1].axhline(AIM, ls="--", color="grey", lw=1, label=f"aim {AIM}x")
    axes[1].axhline(1.0, ls=":", color="grey", lw=1)
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    concs = sorted({lv["concurrency"] for lv in levels})
    titles = ("output tokens/s through the router", "throughput ratio (paired, same prompts)", "ITL p99 (s)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"SPECOPD workers (one core each) behind sglang-router: {payload.get('server_config')} on CPU",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
