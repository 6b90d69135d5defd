"""The demo's PNG: p90 TTFT, ready replicas and paused residents over time, one line per pool.

matplotlib (Agg) is imported only here and only when the plot is drawn, as
``genpool_sim.plots`` does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from genpool_devcluster.demo_load import PoolSample

Series = Sequence[tuple[float, float]]


def write_plot(
    ttft_p90: Mapping[str, Series],
    samples: Mapping[str, Sequence[PoolSample]],
    phases: Sequence[tuple[str, float, float]],
    busy: Collection[str],
    slo_s: float,
    path: Path,
) -> Path:
    """Three stacked panels sharing the time axis, the ``busy`` phases shaded; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for pool, points in ttft_p90.items():
        if points:
            top.plot(*zip(*points, strict=True), marker="o", markersize=3, label=pool)
    top.axhline(slo_s, color="grey", linestyle="--", linewidth=0.8, label="SLO p90 TTFT")
    top.set(ylabel="p90 TTFT (s), per 10 s\nof arrivals", yscale="log")
    for pool, seen in samples.items():
        if seen:
            times = [x.t for x in seen]
            middle.step(times, [x.ready for x in seen], where="post", label=pool)
            bottom.step(times, [x.paused for x in seen], where="post", label=pool)
    middle.set(ylabel="ready replicas")
    middle.yaxis.get_major_locator().set_params(integer=True)
    bottom.set(xlabel="seconds since the load started", ylabel="paused residents")
    for axis in (top, middle, bottom):
        for name, start, end in phases:
            if name in busy:
                axis.axvspan(start, end, color="orange", alpha=0.08)
            if axis is top:
                axis.text((start + end) / 2, 0.97, name, ha="center", va="top",
                          transform=axis.get_xaxis_transform(), fontsize=8)  # fmt: skip
        axis.set_xlim(0, phases[-1][2] if phases else None)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize=8)
    fig.suptitle("The same load on both pools: p90 TTFT, ready replicas, paused residents")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
