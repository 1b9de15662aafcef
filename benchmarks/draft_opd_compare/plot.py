"""The comparison's plot: per arm the overall tau (mean over domains) with its 95% bootstrap interval, T0 and T1."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def save_plot(measured: Mapping[str, Any], path: Path) -> Path:
    """Two panels (T0, T1), one point with error bars per arm (the ``acceptance`` of :func:`.store.assemble`;
    arms whose interval could not be computed are left out); the dashed line is continued SFT's mean. Earlier
    plots move to ``history/`` (:func:`sglang_specopd.app.results.save_figure`). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    acc = measured["acceptance"]
    arms = [a for a in measured["arms"] if all("mean" in acc[a][t] for t in ("T0", "T1"))]
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 1.3 * len(arms) + 2), 4.2), sharey=False)
    for ax, temp in zip(axes, ("T0", "T1")):
        means = [acc[a][temp]["mean"] for a in arms]
        lo = [m - acc[a][temp]["ci95"][0] for a, m in zip(arms, means)]
        hi = [acc[a][temp]["ci95"][1] - m for a, m in zip(arms, means)]
        ax.errorbar(range(len(arms)), means, yerr=[lo, hi], fmt="o", capsize=4)
        if "sft_continued" in arms:
            ax.axhline(acc["sft_continued"][temp]["mean"], color="grey", ls="--", lw=1, label="continued SFT")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(arms)), arms, rotation=40, ha="right", fontsize=8)
        ax.set_ylabel("tau (tokens / verify step), mean over domains")
        ax.set_title(f"served tau on held-out prompts, {temp} (95% CI)")
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
    return Path(path)
