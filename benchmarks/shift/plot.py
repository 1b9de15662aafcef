"""Plot of the traffic-shift result: new-domain tau over minutes after the shift, one line per arm, 95% bands."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict


def plot(result: Dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    try:
        for name, arm in result["arms"].items():
            pts = arm["curve"]
            if not pts:
                continue
            xs = [p["t_s"] / 60 for p in pts]
            ys = [p["new_tau"] for p in pts]
            line, = ax.plot(xs, ys, marker="o", label=name.replace("_", " "))
            ax.fill_between(xs, [p["new_ci95"][0] for p in pts], [p["new_ci95"][1] for p in pts],
                            color=line.get_color(), alpha=0.15)
        ax.set_xlabel("minutes after the traffic shifted to " + ", ".join(result["new_domains"]))
        ax.set_ylabel("served tau on held-out new-domain prompts (T=0)")
        ax.set_title("Adapting to shifted traffic (SmolLM2-135M, 2 CPU cores)")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        return save_figure(fig, path)
    finally:
        plt.close(fig)
