"""Simulator speed: simulated seconds per wall second, R1 c = 250 (docs/design.md#simulator).

Target: >= 50x. Each mode runs one seed of the reference scenario (W = 8,
B = 16, n_ctx = 4, Azure conv lengths); the figure counts simulated time of the
whole run (warm-up and drain included) over wall time, per mode and overall.
"""

from __future__ import annotations

import platform
import time
from typing import Any

from genpool_sim.cluster import MODES, ClusterConfig
from genpool_sim.datafiles import AZURE_CONV, data_file
from genpool_sim.experiment import Workload, simulate
from genpool_sim.workload import parse_csv_trace

TRACE = data_file(AZURE_CONV)
TARGET_SPEEDUP = 50.0


def run(*, quick: bool) -> dict[str, Any]:
    if not TRACE.exists():
        raise SystemExit(f"bench sim needs the Azure trace at {TRACE}")
    with TRACE.open() as handle:
        trace = parse_csv_trace(handle, str(TRACE))
    duration = 60.0 if quick else 600.0
    workload = Workload(trace, concurrency=250, duration_s=duration, warmup_s=duration / 10)
    per_mode: dict[str, dict[str, float]] = {}
    total_sim = total_wall = 0.0
    for mode in MODES:
        config = ClusterConfig(mode=mode, target_output_tps=10.0)
        start = time.perf_counter()
        cluster = simulate(config, workload, seed=0)
        wall = time.perf_counter() - start
        simulated = cluster.now
        per_mode[mode] = {
            "simulated_s": simulated,
            "wall_s": wall,
            "speedup": simulated / wall,
            "requests": float(len(cluster.requests)),
        }
        total_sim += simulated
        total_wall += wall
    speedup = total_sim / total_wall
    return {
        "scenario": "R1 c=250, W=8, B=16, n_ctx=4, one seed per mode",
        "duration_s": duration,
        "per_mode": per_mode,
        "speedup": speedup,
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": speedup >= TARGET_SPEEDUP,
        "python": platform.python_version(),
        "quick": quick,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = [f"simulator speed ({result['scenario']}, {result['duration_s']:.0f} s simulated)"]
    for mode, row in result["per_mode"].items():
        lines.append(f"  {mode:<18} {row['speedup']:8.1f}x  ({row['wall_s']:.1f} s wall)")
    lines.append(
        f"  overall            {result['speedup']:8.1f}x  (target >= {TARGET_SPEEDUP:.0f}x)"
    )
    return "\n".join(lines)
