"""Plots of the replica-law study (bench/results/sim/autoscale_law.json) for
docs/results.md:

    python -m bench.autoscale_plots [--json PATH] [--out docs/img]

- ``autoscale_goals.png``: per goal load, each policy's replica-seconds over the
  oracle's (mean and 95 % CI over seeds) and its SLO windows met;
- ``autoscale_sweeps.png``: genpool's saving against replicas-only (1 - paired ratio)
  over burst length, SLO tightness and slack, the falsification control last.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.autoscale_study import OUT

POLICIES = ("static", "oracle", "replicas-only", "genpool", "llm-d-slo")
IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def _ratio_to_oracle(row: dict[str, Any], policy: str) -> tuple[float, float]:
    runs = row["per_seed"]
    ratios = [a["replica_seconds"] / b["replica_seconds"]
              for a, b in zip(runs[policy], runs["oracle"], strict=True)]  # fmt: skip
    mean = sum(ratios) / len(ratios)
    spread = (sum((r - mean) ** 2 for r in ratios) / max(1, len(ratios) - 1)) ** 0.5
    return mean, 2.0 * spread / len(ratios) ** 0.5


def goals_plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cost, met) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    width = 0.8 / len(POLICIES)
    for k, policy in enumerate(POLICIES):
        xs = [i + (k - len(POLICIES) / 2) * width for i in range(len(rows))]
        bars = [_ratio_to_oracle(row, policy) for row in rows]
        cost.bar(xs, [m for m, _ in bars], width, yerr=[e for _, e in bars], label=policy)
        windows = [row["summary"][policy]["slo_windows_met"]["mean"] for row in rows]
        met.bar(xs, [100 * w for w in windows], width, label=policy)
    cost.axhline(1.15, color="grey", linestyle="--", linewidth=0.8)
    cost.set(ylabel="replica-seconds / oracle's", title="each policy at the shipped defaults")
    met.axhline(95, color="grey", linestyle="--", linewidth=0.8)
    met.set(ylabel="SLO windows met, %", ylim=(50, 101))
    met.set_xticks(range(len(rows)), [_short(row["load"]) for row in rows], rotation=30,
                   ha="right")  # fmt: skip
    cost.legend(ncol=len(POLICIES), fontsize=8)
    for axis in (cost, met):
        axis.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short(load: str) -> str:
    shape, lengths, cv, *_ = load.split("/")
    return f"{shape} {lengths} {cv}"


def sweeps_plot(sweeps: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("bursts", "burst length, s (actuation delay 90 s)", "burst_s"),
              ("tightness", "SLO: x the unloaded GEN TTFT p90", "times"),
              ("slack", "T as a share of the decode rate (1: no slack)", "share")]  # fmt: skip
    present = [p for p in panels if p[0] in sweeps]
    fig, axes = plt.subplots(1, len(present), figsize=(4.5 * len(present), 3.6), squeeze=False)
    for axis, (name, label, key) in zip(axes[0], present, strict=True):
        rows = sweeps[name]["rows"]
        xs = [float(row["labels"][key]) for row in rows]
        ratios = [row["genpool_vs_replicas_only"] for row in rows]
        axis.errorbar(xs, [100 * (1 - r["mean"]) for r in ratios],
                      yerr=[100 * r["ci95"] for r in ratios], marker="o", capsize=3)  # fmt: skip
        axis.axhline(0, color="grey", linewidth=0.8)
        axis.axhline(15, color="grey", linestyle="--", linewidth=0.8)
        axis.set(xlabel=label, ylabel="saving vs replicas-only, %")
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=OUT)
    parser.add_argument("--out", type=Path, default=IMG)
    ns = parser.parse_args(argv)
    result = json.loads(ns.json.read_text())
    ns.out.mkdir(parents=True, exist_ok=True)
    if result.get("goals"):
        goals_plot(result["goals"], ns.out / "autoscale_goals.png")
    if result.get("sweeps"):
        sweeps_plot(result["sweeps"], ns.out / "autoscale_sweeps.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
