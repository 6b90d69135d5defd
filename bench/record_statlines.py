"""Record simulator stat lines for the tuner's tests (tests/unit/core/data/).

Static knobs (no tuner): each file is what the operator would scrape from W = 8
workers, one line per worker every 30 simulated s, in the worker's own format.
Rerun after a change to the stat line or the policy:

    python -m bench.record_statlines
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from genpool_core.statline import parse_statline
from genpool_sim.cli import DEFAULT_TRACE, load_trace
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import Workload, simulate

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "operator" / "data"
T_SLO = 11.6  # tok/s: about the auto T of these loads (off run's median / 1.10)


@dataclass(frozen=True)
class Scenario:
    name: str
    clients: int
    cap_fraction: float
    what: str


SCENARIOS = (
    Scenario("unspent", 200, 0.375, "c=200, P=H=6: below-T under eps, the cap binds"),
    Scenario("overload_laxity", 300, 0.375, "c=300, P=H=6: below-T above eps, laxity victims"),
    Scenario("overload_implicated", 400, 1.0, "c=400, P=H=16: mostly below-target victims"),
    Scenario("light", 100, 0.375, "c=100, P=H=6: no queue, nothing to do"),
)


def record(scenario: Scenario, duration_s: float, seed: int) -> str:
    config = ClusterConfig(
        mode="target_output_tps",
        target_output_tps=T_SLO,
        paused_cap_fraction=scenario.cap_fraction,
    )
    trace = load_trace(DEFAULT_TRACE)
    workload = Workload(trace, concurrency=scenario.clients, duration_s=duration_s, warmup_s=0)
    cluster = simulate(config, workload, seed)
    header = (
        f"# {scenario.what}; T={T_SLO}, W=8, B=16, seed {seed}; python -m bench.record_statlines"
    )
    # Lines after the clients stop come from the drain: not what a live pool reports.
    lines = [
        f"worker={worker} {line}"
        for worker, line in cluster.stat_lines
        if (parsed := parse_statline(line)) is not None and parsed.t <= duration_s
    ]
    return "\n".join([header, *lines]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=210.0, help="simulated s per file")
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for scenario in SCENARIOS:
        path = OUT / f"{scenario.name}.txt"
        path.write_text(record(scenario, ns.duration, ns.seed))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
