"""Replica policies on a day-shaped open loop (issue 13's goal): static, replicas-only
and genpool on the same seeds, through ``genpool sim --autoscale``.

    python -m bench.sim_autoscale                 # writes bench/results/sim/autoscale_*.json
    python -m bench.sim_autoscale --seeds 2 --shapes fast

A compressed day: low (6 req/s), a ramp to 3x (18 req/s), a plateau, the ramp back,
low again; Azure conversation lengths; Gamma arrivals (cv 1). Each shape prints the
summary table and the goal check: genpool meets the SLO in >= 95 % of the 60 s
windows with >= 20 % fewer replica-seconds than replicas-only (paired per seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from genpool_sim.cli import main as sim_main
from genpool_sim.report import mean_ci

OUT = Path(__file__).resolve().parent / "results" / "sim"


def _ramp(low: float, high: float, steps: int, step_s: int) -> list[str]:
    return [f"{step_s}:{low + (high - low) * k / (steps + 1):g}" for k in range(1, steps + 1)]


def _day(ramp_steps: int, step_s: int) -> str:
    up = _ramp(6.0, 18.0, ramp_steps, step_s)
    return ",".join(["300:6", *up, "600:18", *reversed(up), "300:6"])


SHAPES = {
    "fast": _day(4, 60),  # 4 min ramps
    "slow": _day(10, 60),  # 10 min ramps
}
COMMON = ["--cv", "1", "--slo-ttft-p90", "1.0", "--slo-attainment", "0.8",
          "--target-output-tps", "12", "--min-replicas", "4", "--max-replicas", "16",
          "--workers", "12", "--startup-delay", "60", "--warmup", "60"]  # fmt: skip


def run_shape(shape: str, seeds: int, jobs: int) -> dict[str, object]:
    path = OUT / f"autoscale_{shape}.json"
    argv = ["sim", "--autoscale", "--rate-phases", SHAPES[shape], *COMMON,
            "--seeds", str(seeds), "--jobs", str(jobs), "--json", str(path)]  # fmt: skip
    if sim_main(argv) != 0:
        raise SystemExit(f"genpool sim failed for shape {shape}")
    document = json.loads(path.read_text())
    run = document["runs"][0]
    check = goal_check(run["per_seed"])
    run["goal"] = check
    document["bench"] = {"shape": shape, "rate_phases": SHAPES[shape], "argv": argv}
    path.write_text(json.dumps(document, indent=1, allow_nan=True))
    return check


def goal_check(per_seed: list[dict[str, object]]) -> dict[str, object]:
    by: dict[str, dict[int, dict[str, float]]] = {}
    for row in per_seed:
        by.setdefault(str(row["policy"]), {})[int(str(row["seed"]))] = row["metrics"]  # type: ignore[assignment]
    genpool, planner = by["genpool"], by["replicas-only"]
    seeds = sorted(genpool)
    ratios = [genpool[s]["replica_seconds"] / planner[s]["replica_seconds"] for s in seeds]
    saving, saving_ci = mean_ci([1.0 - r for r in ratios])
    met = {p: [by[p][s]["slo_windows_met"] for s in seeds] for p in by}
    return {
        "saving_vs_replicas_only": saving,
        "saving_ci95": saving_ci,
        "saving_per_seed": [1.0 - r for r in ratios],
        "slo_windows_met_per_seed": met,
        "genpool_meets_slo": all(v >= 0.95 for v in met["genpool"]),
        "replicas_only_meets_slo": all(v >= 0.95 for v in met["replicas-only"]),
        "goal_met": all(v >= 0.95 for v in met["genpool"]) and saving >= 0.20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    ns = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for shape in ns.shapes.split(","):
        check = run_shape(shape, ns.seeds, ns.jobs)
        print(f"goal ({shape}): {json.dumps(check)}")


if __name__ == "__main__":
    main()
