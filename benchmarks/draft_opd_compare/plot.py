"""The comparison's plot: per arm the overall tau (mean over domains) with its 95% bootstrap interval, T0 and T1.

:func:`figure` and :func:`ci_points` are the frame and the point-with-interval marks the comparison plots share
(this one and ``drafter_archs/plot.py``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence


@contextlib.contextmanager
def figure(path: Path, ncols: int, figsize: tuple) -> Iterator[Any]:
    """A 1 x ``ncols`` matplotlib figure (Agg backend); yields its axes, then lays it out and saves it to ``path``
    at 120 dpi (earlier plots move to ``history/``, :func:`sglang_specopd.app.results.save_figure`) and closes it,
    also when the block raises (then nothing is saved)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    try:
        yield axes
        fig.tight_layout()
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)


def ci_points(ax, xs: Sequence[float], cells: Sequence[Mapping[str, Any]], **kw) -> None:
    """One point per cell at ``xs`` with error bars of its 95% interval (cells: ``{"mean", "ci95": [lo, hi]}``, the
    intervals of ``specopd_trainer.intervals``); ``kw`` goes to ``ax.errorbar`` (a label, say). Nothing is drawn
    for no cells."""
    if not cells:
        return
    means = [c["mean"] for c in cells]
    lo = [m - c["ci95"][0] for c, m in zip(cells, means)]
    hi = [c["ci95"][1] - m for c, m in zip(cells, means)]
    ax.errorbar(list(xs), means, yerr=[lo, hi], fmt="o", capsize=4, **kw)


def save_plot(measured: Mapping[str, Any], path: Path) -> Path:
    """Two panels (T0, T1), one point with error bars per arm (the ``acceptance`` of :func:`.store.assemble`;
    arms whose interval could not be computed are left out); the dashed line is continued SFT's mean. Returns
    ``path``."""
    acc = measured["acceptance"]
    arms = [a for a in measured["arms"] if all("mean" in acc[a][t] for t in ("T0", "T1"))]
    with figure(path, 2, (max(7.0, 1.3 * len(arms) + 2), 4.2)) as axes:
        for ax, temp in zip(axes, ("T0", "T1")):
            ci_points(ax, range(len(arms)), [acc[a][temp] for a in arms])
            if "sft_continued" in arms:
                ax.axhline(acc["sft_continued"][temp]["mean"], color="grey", ls="--", lw=1, label="continued SFT")
                ax.legend(fontsize=8)
            ax.set_xticks(range(len(arms)), arms, rotation=40, ha="right", fontsize=8)
            ax.set_ylabel("tau (tokens / verify step), mean over domains")
            ax.set_title(f"served tau on held-out prompts, {temp} (95% CI)")
    return Path(path)
