"""Pictures of a benchmark run, written as PNG next to its JSON: series over time
(throughput, lag) and latency percentiles. matplotlib without a display (Agg).

The figures are drawn from the same samples the JSON's numbers come from, so a plot and
its table never disagree."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

PERCENTILES = (50, 90, 95, 99, 99.9)


def per_second(times: Iterable[float], start: float, end: float) -> list[tuple[float, float]]:
    """Events per second (one bucket a second) from their timestamps, from ``start``."""
    buckets = [0] * max(1, int(end - start) + 1)
    for t in times:
        i = int(t - start)
        if 0 <= i < len(buckets):
            buckets[i] += 1
    return [(float(i), float(n)) for i, n in enumerate(buckets)]


def timeline(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, dict[str, Sequence[tuple[float, float]]]]],
) -> Path:
    """Stacked panels sharing the time axis (seconds since the start); each panel is
    ``(y label, {series label: [(t, value), ...]})``."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.8 * len(panels)), sharex=True)
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (ylabel, series) in zip(axes, panels, strict=True):
        for label, points in series.items():
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=label, linewidth=1.2)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    axes[0].set_title(title)
    axes[-1].set_xlabel("seconds since the start")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_percentiles(path: Path, title: str, samples_ms: dict[str, Sequence[float]]) -> Path:
    """Latency by percentile (log scale), one line per series, the usual percentiles
    marked and labelled."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for label, samples in samples_ms.items():
        ordered = sorted(samples)
        if not ordered:
            continue
        n = len(ordered)
        xs = [100 * (i + 1) / n for i in range(n)]
        ax.plot(xs, ordered, label=f"{label} ({n:,} samples)", linewidth=1.2)
        for p in PERCENTILES:
            v = ordered[min(n - 1, max(0, round(p / 100 * n) - 1))]
            ax.scatter([p], [v], s=12)
            ax.annotate(f"p{p:g} {v:,.0f} ms", (p, v), textcoords="offset points",
                        xytext=(-60, 6), fontsize="x-small")  # fmt: skip
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.set_xlim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
