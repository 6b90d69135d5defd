"""The demo's load in the simulator: both pools at the replica scaler's defaults, what
they cost and whether they meet the SLO.

    python -m bench.sim_demo_load [--seeds 8]     # writes bench/results/sim/demo_load.json
    python -m bench.sim_demo_load --slo-ttft-p90 0.3   # ... demo_load_slo0.3.json

``make demo`` runs ``genpool`` (pausing, the tuner, the scaler) and ``replicas-only``
(preemption off, the same scaler) at the law's defaults, the capacity learned: no
setting to pick. This runs the same pools on the same load, its phases, length mix and
request classes from ``demo_load``, and the same spec numbers from ``demo_pools`` (the
bounds, the 5 s rounds, B, the start-up the synthetic workers take and the pools state);
the step model is the synthetic workers' (the simulator's default). Each ``--learn-days``
entry is one run (default 0): 0 is a new pool (the demo's fresh GenPools), 1 a pool that
has served the load once before (its learned capacity persists in its status). Per entry: each
pool's replica-seconds, p90 GEN TTFT and attainment over the whole load, SLO windows met,
and genpool's saving against replicas-only, paired per seed (the demo's ratio is 1 minus
it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.provenance import provenance
from genpool_devcluster import demo_pools
from genpool_devcluster.demo_load import CLASSES, LENGTH_MIX
from genpool_devcluster.loadgen import PROMPTS
from genpool_sim.cli import main as sim_main
from genpool_sim.report import mean_ci

OUT = Path(__file__).resolve().parent / "results" / "sim" / "demo_load.json"
POLICIES = (demo_pools.REPLICAS_ONLY, demo_pools.GENPOOL)
STARTUP_DELAY_S = float(demo_pools.STARTUP_S)  # the pools' spec.autoscaling.startupSeconds


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


def sim_argv(
    trace: Path, learn_days: int, seeds: int, out: Path, slo_ttft_s: float,
    min_replicas: int = demo_pools.MIN_REPLICAS,
) -> list[str]:  # fmt: skip
    """``genpool sim --autoscale`` for the demo's pools: the specs' numbers, no ceiling."""
    specs = demo_pools.pool_specs(min_replicas=min_replicas, slo_ttft_s=slo_ttft_s)
    spec = specs[demo_pools.GENPOOL]
    auto = spec["autoscaling"]
    phases = ",".join(f"{p.duration_s:g}:{p.rate_per_s:g}" for p in demo_pools.PHASES)
    return ["sim", "--autoscale", "--policies", ",".join(POLICIES), "--trace", str(trace),
            "--rate-phases", phases, "--classes", _classes(),
            "--max-batch", str(spec["engine"]["maxBatchSize"]),
            "--target-output-tps", f"{demo_pools.TARGET_TPS:g}",
            "--slo-ttft-p90", f"{spec['slo']['ttftP90Seconds']:g}",
            "--slo-attainment", f"{spec['slo']['attainment']:g}",
            "--min-replicas", str(auto["minReplicas"]),
            "--max-replicas", str(auto["maxReplicas"]),
            "--startup-delay", f"{auto['startupSeconds']:g}",
            "--scale-interval", str(spec["tuning"]["intervalSeconds"]),
            "--learn-days", str(learn_days),
            "--warmup", "0", "--seeds", str(seeds), "--json", str(out)]  # fmt: skip


def run_point(trace: Path, learn_days: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = sim_argv(trace, learn_days, args.seeds, out, args.slo_ttft_p90, args.min_replicas)
    if sim_main(argv) != 0:
        raise SystemExit(f"genpool sim failed: {' '.join(argv)}")
    run: dict[str, Any] = json.loads(out.read_text())["runs"][0]
    return run


def row(policy: str, learn_days: int, run: dict[str, Any], slo_ttft_s: float) -> dict[str, Any]:
    mine = run["summary"][policy]
    per_seed = {r["seed"]: r["metrics"]["replica_seconds"] for r in run["per_seed"]
                if r["policy"] == policy}  # fmt: skip
    p90, below = mine["ttft_p90"]["mean"], mine["below_target"]["mean"]
    return {
        "policy": policy, "learn_days": learn_days,
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


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'policy':14} {'learn':>5} {'replica-s':>14} {'p90 TTFT s':>14} "
             f"{'attain':>6} {'windows':>7} {'meets':>5}"]  # fmt: skip
    for r in rows:
        cost, p90, met = r["replica_seconds"], r["ttft_p90_s"], r["slo_windows_met"]
        lines.append(f"{r['policy']:14} {r['learn_days']:>5} "
                     f"{cost['mean']:>7.0f} ±{cost['ci95']:<5.0f} {p90['mean']:>6.3f} "
                     f"±{p90['ci95']:<6.3f} {r['attainment']:>6.1%} {met['mean']:>7.1%} "
                     f"{'yes' if r['meets_slo'] else 'no':>5}")  # fmt: skip
    return "\n".join(lines)


def _days(text: str) -> tuple[int, ...]:
    try:
        days = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated days, e.g. 0,1") from None
    if not days or any(not 0 <= d <= 30 for d in days):
        raise argparse.ArgumentTypeError(f"{text!r}: each day count in 0..30")
    return days


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sim_demo_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=8, help="seeds per run (default: 8)")
    parser.add_argument(
        "--slo-ttft-p90", type=float, default=demo_pools.SLO_TTFT_S, help="the SLO's p90 TTFT, s"
    )
    parser.add_argument("--min-replicas", type=int, default=demo_pools.MIN_REPLICAS,
                        choices=range(1, demo_pools.MAX_REPLICAS + 1),
                        help="both pools' minReplicas (default: %(default)s)")  # fmt: skip
    parser.add_argument("--learn-days", type=_days, default=(0,),
                        help="days of the load each pool served before, one run per entry, "
                             "e.g. 0,1 (default: 0, new pools as in the demo)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="the JSON (default: bench/results/sim/"
                        "demo_load.json, demo_load_slo<S>.json at another SLO)")  # fmt: skip
    args = parser.parse_args(argv)
    if not (args.seeds >= 1 and 0 < args.slo_ttft_p90 <= 3600):
        parser.error("need --seeds >= 1 and 0 < --slo-ttft-p90 <= 3600")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    slo = args.slo_ttft_p90
    default = OUT if slo == demo_pools.SLO_TTFT_S else OUT.with_name(f"demo_load_slo{slo:g}.json")
    out_path: Path = args.out or default
    rows: list[dict[str, Any]] = []
    savings: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(Path(tmp) / "demo_lengths.csv")
        for days in args.learn_days:
            run = run_point(trace, days, Path(tmp) / "r.json", args)
            pair = {p: row(p, days, run, slo) for p in POLICIES}
            rows += pair.values()
            savings[str(days)] = paired_saving(pair[demo_pools.GENPOOL],
                                               pair[demo_pools.REPLICAS_ONLY])  # fmt: skip
    print(format_table(rows))
    for days, saving in savings.items():
        print(f"learn-days {days}: genpool's saving against replicas-only, paired per seed: "
              f"{saving['mean']:.1%} ±{saving['ci95']:.1%}")  # fmt: skip
    document = {**provenance("bench.sim_demo_load"), "seeds": args.seeds,
                "slo_ttft_p90_s": slo, "min_replicas": args.min_replicas,
                "startup_s": STARTUP_DELAY_S, "rows": rows, "saving": savings}  # fmt: skip
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(document, indent=1))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
