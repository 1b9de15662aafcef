"""Plot of the OPD comparison: per regime, each OPD arm's paired difference to continued SFT with its 95% interval."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict


def plot(result: Dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    rows = [(f"{name}\n{arm}", a["paired_diff_vs_sft"]) for name, e in result["regimes"].items()
            for arm, a in e["arms"].items() if arm != "sft_continued"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(4, len(rows)) + 1))
    try:
        for i, (label, d) in enumerate(rows):
            lo, hi = d["ci95"]
            ax.errorbar(d["mean"], i, xerr=[[d["mean"] - lo], [hi - d["mean"]]], fmt="o",
                        color="tab:green" if lo > 0 else ("tab:red" if hi < 0 else "tab:gray"), capsize=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
        ax.set_xlabel("served tau - continued SFT (paired 95% interval)")
        ax.set_title("OPD arms vs continued SFT from a plateaued SFT start")
        return save_figure(fig, path)
    finally:
        plt.close(fig)
