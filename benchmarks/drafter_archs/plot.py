"""The comparison's plot: tau by architecture and drafter stage at T0 and T1 (95% CI bars), and serving speedup."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from drafter_archs.merge import STAGES
from drafter_archs.store import TEMPS

LABELS = {"sft": "after SFT", "specopd": "after SpecOPD"}


def save_plot(measured: Mapping[str, Any], path: Path) -> Path:
    """Three panels: served tau (mean over domains, tokens per verify step) per architecture after SFT and after
    SpecOPD with 95% bootstrap intervals, at T0 and at T1; and output tokens/s of speculative over plain serving
    per architecture at each measured concurrency (dashed line: 1.0, plain serving). Stages or levels not measured
    are left out. Earlier plots move to ``history/`` (:func:`sglang_specopd.app.results.save_figure`). Returns
    ``path``."""
    from draft_opd_compare.plot import ci_points, figure

    blocks = measured["archs"]
    archs = list(blocks)
    width = 0.35
    with figure(path, 3, (max(10.0, 3.2 * len(archs) + 4), 4.2)) as axes:
        for ax, temp in zip(axes[:2], TEMPS):
            for k, stage in enumerate(STAGES):
                cells = [(i, blocks[a]["acceptance"].get(stage, {}).get(temp, {})) for i, a in enumerate(archs)]
                cells = [(i, c) for i, c in cells if "mean" in c]
                ci_points(ax, [i + (k - 0.5) * width for i, _ in cells], [c for _, c in cells], label=LABELS[stage])
            ax.set_xticks(range(len(archs)), archs)
            ax.set_ylabel("tau (tokens / verify step), mean over domains")
            ax.set_title(f"served tau, held-out prompts, {temp} (95% CI)", fontsize=9)
            ax.legend(fontsize=8)
        ax = axes[2]
        levels = sorted({c for a in archs for c in blocks[a]["speedup"]}, key=int)
        for k, c in enumerate(levels):
            vals = [(i, blocks[a]["speedup"].get(c)) for i, a in enumerate(archs)]
            vals = [(i, v) for i, v in vals if v]
            if vals:
                off = (k - (len(levels) - 1) / 2) * (0.8 / max(1, len(levels)))
                ax.bar([i + off for i, _ in vals], [v for _, v in vals], width=0.8 / max(1, len(levels)),
                       label=f"concurrency {c}")
        ax.axhline(1.0, ls="--", color="grey", lw=1)
        ax.set_xticks(range(len(archs)), archs)
        ax.set_ylabel("output tokens/s, speculative / plain")
        temps = sorted({f"T={b['serve_temperature']:g}" for b in blocks.values()
                        if b.get("serve_temperature") is not None})
        ax.set_title(f"serving the SpecOPD drafter vs plain{' (' + ', '.join(temps) + ')' if temps else ''}",
                     fontsize=9)
        if levels:
            ax.legend(fontsize=8)
    return Path(path)
