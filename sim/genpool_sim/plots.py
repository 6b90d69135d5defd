"""PNG plots of a simulation (matplotlib, Agg): TTFT CDFs and below-T over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from genpool_core.statline import parse_statline
from genpool_sim.experiment import RunResult


def write_plots(results: Mapping[tuple[str, float], Sequence[RunResult]], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for (name, fraction), runs in results.items():
        seed0 = [r for r in runs if r.seed == 0 and r.records]
        if not seed0:
            continue
        tag = f"{name.replace('=', '')}_cap{fraction}"
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for run in seed0:
            ttft = sorted(r.ttft for r in run.records if r.ttft is not None)
            n = len(ttft)
            axes[0].plot(ttft, [i / n for i in range(n)], label=run.mode)
            lines = [parse_statline(text) for _, text in run.stat_lines]
            points = [(s.t, s.below_target_window) for s in lines
                      if s is not None and s.below_target_window is not None]  # fmt: skip
            if points:
                axes[1].scatter(*zip(*points, strict=True), s=6, label=run.mode)
        axes[0].set(xlabel="TTFT (s)", ylabel="CDF", title=f"TTFT, {name}, seed 0")
        axes[1].set(xlabel="simulated time (s)", ylabel="below T (stat-line window)",
                    title="below-T per worker and 30 s window")  # fmt: skip
        axes[1].axhline(0.2, color="grey", linestyle="--", linewidth=0.8)
        for axis in axes:
            axis.legend()
            axis.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(folder / f"sim_{tag}.png", dpi=110)
        plt.close(fig)
