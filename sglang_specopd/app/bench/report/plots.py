"""PNG plots of the benchmark report (matplotlib Agg): throughput and speedup vs concurrency, tau per domain."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _levels(data: Mapping[str, Any]) -> list:
    return [lv for lv in data.get("levels") or [] if isinstance(lv, Mapping) and "concurrency" in lv]


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_throughput(results: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Output tokens/s vs concurrency, speculative (solid) and plain (dashed), one pair of lines per result file."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    try:
        for name, data in results.items():
            for role, style in (("specopd", "-o"), ("baseline", "--s")):
                pts = [(lv["concurrency"], lv[role]["output_tokens_per_s"]) for lv in _levels(data)
                       if isinstance(lv.get(role), Mapping) and lv[role].get("output_tokens_per_s") is not None]
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{name[:-5]}: {'SpecOPD' if role == 'specopd' else 'plain'}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("output tokens / s")
        ax.set_title("Throughput vs concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_speedup(results: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Speculative / plain output tokens/s vs concurrency, with the break-even line at 1."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    try:
        for name, data in results.items():
            pts = [(lv["concurrency"], lv["speedup"]["output_tokens_per_s"]) for lv in _levels(data)
                   if isinstance(lv.get("speedup"), Mapping) and lv["speedup"].get("output_tokens_per_s") is not None]
            if pts:
                ax.plot(*zip(*pts), "-o", label=name[:-5])
        ax.axhline(1.0, color="k", ls="--", lw=1, label="break-even")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("speedup (SpecOPD / plain tokens/s)")
        ax.set_title("Speedup over autoregressive decoding")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_acceptance(series: Mapping[str, Mapping[str, float]], path: Path) -> Path:
    """Grouped bars: tau (tokens per verify step) per domain, one bar per series."""
    plt = _plt()
    domains: Dict[str, None] = {}
    for taus in series.values():
        domains.update(dict.fromkeys(taus))
    names = list(domains)
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(2.0 + 1.6 * len(names), 4.2))
    try:
        for i, (label, taus) in enumerate(series.items()):
            xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(names))]
            ax.bar(xs, [taus.get(d, 0.0) for d in names], width, label=label)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("acceptance length tau (tokens / verify step)")
        ax.set_ylim(0.9, max([1.05] + [v for t in series.values() for v in t.values()]) * 1.08)
        ax.set_title("Acceptance length per domain")
        ax.legend(fontsize=7)
        return _save(fig, path)
    finally:
        plt.close(fig)
