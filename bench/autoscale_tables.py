"""The replica-law study's tables for docs/results.md, from its JSON:

    python -m bench.autoscale_tables [--json bench/results/sim/autoscale_law.json]

prints the goals table (every policy on every goal load: replica-seconds over the
oracle's, SLO windows met) and the sweeps table (genpool against replicas-only over
burst length, SLO tightness and slack), in markdown. Pure formatting of what
``bench.autoscale_study`` wrote; the arithmetic is ``bench.autoscale_report``'s.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import autoscale_report as report
from bench.autoscale_study import OUT

POLICIES = ("static", "oracle", "replicas-only", "genpool", "llm-d-slo")
GOALS = (
    ("windows_met", ">= 95 % windows"),
    ("vs_oracle", "<= 1.15x oracle"),
    ("vs_static", "<= 0.85x static"),
    ("vs_replicas_only", "<= 0.85x replicas-only"),
    ("vs_llm_d_slo", "< llm-d-slo, windows >="),
)


def _cost(row: Mapping[str, Any], policy: str) -> str:
    """``9097 (1.45x)``: mean replica-seconds and the paired ratio to the oracle."""
    summary = row["summary"].get(policy)
    if summary is None:
        return "-"
    mean = summary["replica_seconds"]["mean"]
    ratio = report.paired_ratio(row["per_seed"], policy, "oracle")
    if ratio is None or policy == "oracle":
        return f"{mean:.0f}"
    return f"{mean:.0f} ({ratio['mean']:.2f}x)"


def _windows(row: Mapping[str, Any], policy: str) -> str:
    summary = row["summary"].get(policy)
    if summary is None:
        return "-"
    met = summary["slo_windows_met"]
    return f"{100 * met['mean']:.1f} / {100 * met['min']:.0f}"


def goals_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Cost and windows per policy and load; the static pool's size in brackets."""
    head = (
        "| sweep | value | genpool / replicas-only | saving | windows genpool / replicas-only (%) |"
    )
    lines = [head, "|" + "---|" * (len(POLICIES) + 1)]
    for row in rows:
        cells = [_cost(row, p) for p in POLICIES]
        cells[0] = f"{cells[0]} [{row['static_replicas']}]"
        lines.append(f"| {row['load']} | " + " | ".join(cells) + " |")
        windows = " | ".join(_windows(row, p) for p in POLICIES)
        lines.append(f"| windows met, mean / worst seed (%) | {windows} |")
    return "\n".join(lines)


def _verdict_cell(goal: Mapping[str, Any] | None, name: str) -> str:
    if goal is None:
        return "-"
    if name == "windows_met":
        text = f"{100 * goal['value']:.1f} %"
    else:
        text = f"{goal['value']:.2f} ± {goal['ci95']:.2f}"
    if name == "vs_static" and not goal.get("allowed", True):
        return f"{text} (shape does not allow it)"
    return f"{text} **{'met' if goal['met'] else 'not met'}**"


def verdicts_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """genpool's goals per load, each a value and its verdict."""
    lines = ["| load | " + " | ".join(label for _, label in GOALS) + " |",
             "|" + "---|" * (len(GOALS) + 1)]  # fmt: skip
    for row in rows:
        cells = [_verdict_cell(row["goals"].get(name), name) for name, _ in GOALS]
        lines.append(f"| {row['load']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweeps_table(sweeps: Mapping[str, Any]) -> str:
    """genpool / replicas-only per sweep row (paired ratio), with both pools' windows."""
    head = (
        "| sweep | value | genpool / replicas-only | saving | windows genpool / replicas-only (%) |"
    )
    lines = [head, "|---|---|---|---|---|"]
    for name, sweep in sweeps.items():
        for row in sweep["rows"]:
            ratio = row["genpool_vs_replicas_only"]
            value = ", ".join(f"{k} {v}" for k, v in row["labels"].items())
            met = row["summary"]
            windows = (f"{100 * met['genpool']['slo_windows_met']['mean']:.1f} / "
                       f"{100 * met['replicas-only']['slo_windows_met']['mean']:.1f}")  # fmt: skip
            saving = 100 * (1 - ratio["mean"])
            lines.append(f"| {name} | {value} | {ratio['mean']:.3f} ± {ratio['ci95']:.3f} | "
                         f"{saving:+.1f} % | {windows} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=OUT)
    ns = parser.parse_args(argv)
    result = json.loads(ns.json.read_text())
    print(f"<!-- {result['meta']['command']} at {result['meta']['commit'][:10]} -->\n")
    print(goals_table(result.get("goals", [])) + "\n")
    print(verdicts_table(result.get("goals", [])) + "\n")
    if result.get("sweeps"):
        print(sweeps_table(result["sweeps"]))
    extras = {k: v for k, v in result.get("sweeps", {}).items() if not isinstance(v, dict)}
    for name, value in extras.items():
        print(f"{name}: {value if not isinstance(value, float) or math.isfinite(value) else '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
