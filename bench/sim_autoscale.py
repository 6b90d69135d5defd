"""Replica policies on a day-shaped open loop (docs/results.md's goal): static, replicas-only
and genpool on the same seeds, through ``genpool sim --autoscale``.

    python -m bench.sim_autoscale --ablation      # writes bench/results/sim/autoscale_*.json
    python -m bench.sim_autoscale --seeds 2 --shapes fast --cv 1,2

A compressed day: low (6 req/s), a ramp to 3x (18 req/s), a plateau, the ramp back,
low again; Azure conversation lengths; Gamma arrivals (cv 1). Each shape prints the
summary table and the goal check: genpool meets the SLO in >= 95 % of the 60 s
windows with >= 20 % fewer replica-seconds than replicas-only (paired per seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.sim_autoscale_sweep import day
from genpool_sim.cli import main as sim_main
from genpool_sim.report import mean_ci

OUT = Path(__file__).resolve().parent / "results" / "sim"


SHAPES = {
    "fast": day(6.0, 18.0, ramp_steps=4, step_s=60, low_s=300, peak_s=600),  # 4 min ramps
    "slow": day(6.0, 18.0, ramp_steps=10, step_s=60, low_s=300, peak_s=600),  # 10 min ramps
}
COMMON = ["--slo-ttft-p90", "1.0", "--slo-attainment", "0.8",
          "--target-output-tps", "12", "--min-replicas", "4", "--max-replicas", "16",
          "--workers", "12", "--startup-delay", "60", "--warmup", "60"]  # fmt: skip


def run_shape(shape: str, cv: float, seeds: int, jobs: int) -> dict[str, object]:
    path = OUT / f"autoscale_{shape}_cv{cv:g}.json"
    argv = ["sim", "--autoscale", "--rate-phases", SHAPES[shape], "--cv", f"{cv:g}", *COMMON,
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


def ablation(shape: str, cv: float, seeds: int, jobs: int) -> dict[str, object]:
    """replicas-only with genpool's utilisation ceiling (0.95): is the saving the margin?"""
    from concurrent.futures import ProcessPoolExecutor

    from genpool_core.knobs import KnobBounds
    from genpool_sim.autoscale import AutoscaleConfig, run_policy
    from genpool_sim.cli import DEFAULT_TRACE, load_trace
    from genpool_sim.cluster import ClusterConfig
    from genpool_sim.experiment import Workload
    from genpool_sim.pool_control import TuneConfig
    from genpool_sim.workload import parse_rate_phases

    workload = Workload(load_trace(DEFAULT_TRACE), rate_phases=parse_rate_phases(SHAPES[shape]),
                        cv=cv, warmup_s=60.0)  # fmt: skip
    auto = AutoscaleConfig(slo_ttft_p90_s=1.0, target_output_tps=12.0, min_replicas=4,
                           max_replicas=16, planner_max_utilisation=0.95)  # fmt: skip
    base = ClusterConfig(workers=12, max_batch=16)
    tune = TuneConfig(KnobBounds(0, 16, 0, 16))
    args = [("replicas-only", base, workload, s, auto, tune) for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(run_policy, *zip(*args, strict=True)))
    result = {
        "policy": "replicas-only, utilisation ceiling 0.95", "shape": shape, "cv": cv,
        "per_seed": [r.metrics for r in runs],
        "replica_seconds": mean_ci([r.metrics["replica_seconds"] for r in runs]),
        "slo_windows_met": mean_ci([r.metrics["slo_windows_met"] for r in runs]),
    }  # fmt: skip
    (OUT / f"autoscale_{shape}_cv{cv:g}_ablation.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--cv", default="1", help="comma-separated arrival CVs")
    parser.add_argument("--ablation", action="store_true",
                        help="also replicas-only with the 0.95 ceiling")  # fmt: skip
    ns = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for cv in (float(text) for text in ns.cv.split(",")):
        for shape in ns.shapes.split(","):
            check = run_shape(shape, cv, ns.seeds, ns.jobs)
            print(f"goal ({shape}, cv {cv:g}): {json.dumps(check)}")
            if ns.ablation:
                result = ablation(shape, cv, ns.seeds, ns.jobs)
                print(
                    f"ablation ({shape}, cv {cv:g}): replica-seconds "
                    f"{result['replica_seconds']}, SLO windows {result['slo_windows_met']}"
                )


if __name__ == "__main__":
    main()
