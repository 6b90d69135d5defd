"""The demo's load in the simulator: which setting meets the SLO, and what it costs.

    python -m bench.sim_demo_load [--seeds 8]     # writes bench/results/sim/demo_load.json
    python -m bench.sim_demo_load --slo-ttft-p90 0.3   # ... demo_load_slo0.3.json

``make demo`` runs each pool at the setting this sweep picks (docs/demo_pools.md): for
``replicas-only`` and ``genpool`` over ``minReplicas`` x the scaler's utilisation ceiling,
the cheapest setting (replica-seconds, mean over seeds) whose p90 GEN TTFT over the whole
load is within the SLO and whose attainment is at least the SLO's. The load is the demo's
own (its phases, length mix and request classes, from ``demo_load``); the step model is
the synthetic workers' (the simulator's default); startup delay and scaler interval are
what the devcluster shows (ready 15 s after a scale-up, 5 s rounds).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from genpool_devcluster import demo_pools
from genpool_devcluster.demo_load import CLASSES, LENGTH_MIX
from genpool_devcluster.loadgen import PROMPTS
from genpool_sim.cli import main as sim_main
from genpool_sim.report import mean_ci

OUT = Path(__file__).resolve().parent / "results" / "sim" / "demo_load.json"
MIN_REPLICAS = (1, 2)
CEILINGS = (0.7, 0.85, 0.95)
POLICIES = (demo_pools.REPLICAS_ONLY, demo_pools.GENPOOL)
STARTUP_DELAY_S = 15.0  # the devcluster's synthetic workers: ready 15-20 s after a scale-up


def write_trace(path: Path) -> Path:
    """The demo's length mix as a CSV trace the simulator samples pairs from."""
    prompt = round(sum(len(p) for p in PROMPTS) / len(PROMPTS))  # synthetic tokens are bytes
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    for length, weight in LENGTH_MIX:
        rows += [f"{len(rows) * 0.01:.2f},{prompt},{length}"] * round(weight * 100)
    path.write_text("\n".join(rows) + "\n")
    return path


def _classes() -> str:
    parts = []
    for c in CLASSES:
        part = f"{c.name}:{c.share:g}"
        part += "" if c.output_tps is None else f":tpot_ms={1000 / c.output_tps:g}"
        part += "" if c.ttft_s is None else f":ttft_ms={c.ttft_s * 1000:g}"
        parts.append(part)
    return ",".join(parts)


def run_point(
    trace: Path, min_replicas: int, ceiling: float, seeds: int, out: Path, slo_ttft_s: float
) -> dict[str, Any]:
    phases = ",".join(f"{p.duration_s:g}:{p.rate_per_s:g}" for p in demo_pools.PHASES)
    argv = ["sim", "--autoscale", "--policies", ",".join(POLICIES), "--trace", str(trace),
            "--rate-phases", phases, "--classes", _classes(),
            "--max-batch", str(demo_pools.BASE_SPEC["engine"]["maxBatchSize"]),
            "--target-output-tps", f"{demo_pools.TARGET_TPS:g}",
            "--slo-ttft-p90", f"{slo_ttft_s:g}",
            "--slo-attainment", f"{demo_pools.SLO_ATTAINMENT:g}",
            "--min-replicas", str(min_replicas), "--max-replicas", str(demo_pools.MAX_REPLICAS),
            "--startup-delay", f"{STARTUP_DELAY_S:g}",
            "--scale-interval", str(demo_pools.BASE_SPEC["tuning"]["intervalSeconds"]),
            "--planner-max-utilisation", f"{ceiling:g}",
            "--genpool-max-utilisation", f"{ceiling:g}",
            "--warmup", "0", "--seeds", str(seeds), "--json", str(out)]  # fmt: skip
    if sim_main(argv) != 0:
        raise SystemExit(f"genpool sim failed: {' '.join(argv)}")
    run: dict[str, Any] = json.loads(out.read_text())["runs"][0]
    return run


def row(
    policy: str, min_replicas: int, ceiling: float, run: dict[str, Any], slo_ttft_s: float
) -> dict[str, Any]:
    mine = run["summary"][policy]
    per_seed = {r["seed"]: r["metrics"]["replica_seconds"] for r in run["per_seed"]
                if r["policy"] == policy}  # fmt: skip
    p90, below = mine["ttft_p90"]["mean"], mine["below_target"]["mean"]
    return {
        "policy": policy, "min_replicas": min_replicas, "ceiling": ceiling,
        "replica_seconds": mine["replica_seconds"], "ttft_p90_s": mine["ttft_p90"],
        "attainment": 1.0 - below, "slo_windows_met": mine["slo_windows_met"],
        "meets_slo": p90 <= slo_ttft_s and 1.0 - below >= demo_pools.SLO_ATTAINMENT,
        "replica_seconds_per_seed": per_seed,
    }  # fmt: skip


def paired_saving(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """1 - ours / theirs in replica-seconds, per seed (the same seed, the same arrivals)."""
    a, b = ours["replica_seconds_per_seed"], theirs["replica_seconds_per_seed"]
    mean, ci = mean_ci([1.0 - a[seed] / b[seed] for seed in sorted(a)])
    return {"mean": mean, "ci95": ci}


def cheapest_meeting(rows: list[dict[str, Any]], policy: str) -> dict[str, Any] | None:
    meeting = [r for r in rows if r["policy"] == policy and r["meets_slo"]]
    return min(meeting, key=lambda r: r["replica_seconds"]["mean"], default=None)


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'policy':14} {'min':>3} {'ceil':>5} {'replica-s':>14} {'p90 TTFT s':>14} "
             f"{'attain':>6} {'meets':>5}"]  # fmt: skip
    for r in rows:
        cost, p90 = r["replica_seconds"], r["ttft_p90_s"]
        lines.append(f"{r['policy']:14} {r['min_replicas']:>3} {r['ceiling']:>5g} "
                     f"{cost['mean']:>7.0f} ±{cost['ci95']:<5.0f} {p90['mean']:>6.3f} "
                     f"±{p90['ci95']:<6.3f} {r['attainment']:>6.1%} "
                     f"{'yes' if r['meets_slo'] else 'no':>5}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_demo_load", description=__doc__)
    parser.add_argument("--seeds", type=int, default=8, help="seeds per point (default: 8)")
    parser.add_argument(
        "--slo-ttft-p90", type=float, default=demo_pools.SLO_TTFT_S, help="the SLO's p90 TTFT, s"
    )
    args = parser.parse_args(argv)
    if not (args.seeds >= 1 and 0 < args.slo_ttft_p90 <= 3600):
        parser.error("need --seeds >= 1 and 0 < --slo-ttft-p90 <= 3600")
    slo = args.slo_ttft_p90
    out_path = OUT if slo == demo_pools.SLO_TTFT_S else OUT.with_name(f"demo_load_slo{slo:g}.json")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(Path(tmp) / "demo_lengths.csv")
        for min_replicas in MIN_REPLICAS:
            for ceiling in CEILINGS:
                out = Path(tmp) / "r.json"
                run = run_point(trace, min_replicas, ceiling, args.seeds, out, slo)
                rows += [row(p, min_replicas, ceiling, run, slo) for p in POLICIES]
    chosen = {policy: cheapest_meeting(rows, policy) for policy in POLICIES}
    ours, theirs = chosen[demo_pools.GENPOOL], chosen[demo_pools.REPLICAS_ONLY]
    saving = None if ours is None or theirs is None else paired_saving(ours, theirs)
    print(format_table(rows))
    for policy, pick in chosen.items():
        if pick is None:
            print(f"{policy}: no setting meets the SLO")
        else:
            print(f"{policy}: minReplicas {pick['min_replicas']}, ceiling {pick['ceiling']:g}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if saving is not None:
        print(f"genpool's saving at the picks, paired per seed: {saving['mean']:.1%} "
              f"±{saving['ci95']:.1%}")  # fmt: skip
    document = {"seeds": args.seeds, "slo_ttft_p90_s": slo, "rows": rows, "chosen": chosen,
                "saving": saving}  # fmt: skip
    out_path.write_text(json.dumps(document, indent=1))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
