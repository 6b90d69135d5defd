"""Markdown tables for docs/results.md from `genpool sim --json` output.

python -m bench.sim_tables bench/results/sim/r1.json          # per-scenario tables
python -m bench.sim_tables bench/results/sim/cap_curve.json --curve
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from genpool_sim.report import TABLE_METRICS

GOAL_ROWS = (
    ("ttft_p90", "p90 TTFT", "pct"),
    ("admission_wait_p99", "p99 admission wait", "pct"),
    ("tpot_mean", "mean TPOT", "pct"),
    ("below_target", "below T", "abs"),
    ("output_tokens_per_s", "total tokens/s", "pct"),
    ("e2e_p90", "p90 E2E", "pct"),
)


def _fmt(entry: dict[str, float] | None, key: str) -> str:
    if entry is None or math.isnan(entry.get("mean", math.nan)):
        return "-"
    mean = entry["mean"]
    text = f"{100 * mean:.1f} %" if key == "below_target" else f"{mean:.3g}"
    if "delta" in entry:
        if key == "below_target":
            text += f" ({100 * entry['delta']:+.1f} pt ± {100 * entry['delta_ci95']:.1f})"
        else:
            text += (
                f" ({entry['delta']:+.3g} ± {entry['delta_ci95']:.2g}; {entry['delta_pct']:+.1f} %)"
            )
    return text


def scenario_table(run: dict[str, Any]) -> str:
    summary = run["summary"]
    modes = list(summary)
    lines = ["| metric | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for key, label in TABLE_METRICS:
        lines.append(
            f"| {label} | " + " | ".join(_fmt(summary[m].get(key), key) for m in modes) + " |"
        )
    return "\n".join(lines)


def curve_table(runs: list[dict[str, Any]], mode: str) -> str:
    lines = [
        "| scenario | P / A | p90 TTFT Δ | p99 wait Δ | mean TPOT Δ | below T | p90 E2E Δ "
        "| tok/s Δ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"].get(mode)
        if s is None:
            continue

        def pct(key: str, s: dict[str, Any] = s) -> str:
            return f"{s[key]['delta_pct']:+.1f} %"

        lines.append(
            f"| {run['scenario']} | {run['paused_cap_fraction']} | {pct('ttft_p90')} | "
            f"{pct('admission_wait_p99')} | {pct('tpot_mean')} | "
            f"{100 * s['below_target']['mean']:.1f} % | {pct('e2e_p90')} | "
            f"{pct('output_tokens_per_s')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("json", type=Path)
    parser.add_argument("--curve", action="store_true")
    ns = parser.parse_args()
    document = json.loads(ns.json.read_text())
    if ns.curve:
        for mode in ("target_output_tps", "tpot_budget"):
            print(f"\n{mode}\n\n{curve_table(document['runs'], mode)}")
        return
    for run in document["runs"]:
        print(f"\n### {run['scenario']}, P = {run['paused_cap_fraction']} A\n")
        print(scenario_table(run))


if __name__ == "__main__":
    main()
