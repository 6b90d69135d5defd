"""Issue 32's study of the replica law, every policy at the shipped defaults.

    python -m bench.autoscale_study [--seeds 8] [--jobs 2] [--parts goals,bursts,...]

writes bench/results/sim/autoscale_law.json and the plots in docs/img/autoscale_*.png
(docs/results.md#replicas-that-come-and-go). Loads and settings: bench/autoscale_cases.py;
the arithmetic: bench/autoscale_report.py. Policies (genpool_sim.autoscale):

- ``static``: the fewest replicas that meet the SLO at the load's peak, found by sweep
  (a flat run at the peak rate per count), pausing on;
- ``oracle``: the cheapest per-phase schedule: each rate's fewest replicas that meet
  the SLO (the same sweep, per level), started a start-up ahead of its phase;
- ``replicas-only``: the shipped law, pausing off; ``genpool``: the shipped law with
  pausing and the tuner; both have served the load once before (``learn_days=1``:
  a pool's learned capacity persists in its status from day to day);
- ``llm-d-slo``: llm-d's published SLO-aware law, pausing off.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import autoscale_cases as cases
from bench import autoscale_report as report
from bench.provenance import provenance
from genpool_core.knobs import KnobBounds
from genpool_sim.autoscale import AutoscaleConfig, run_policy
from genpool_sim.cli import DEFAULT_TRACE, load_trace
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import Workload
from genpool_sim.pool_control import TuneConfig
from genpool_sim.workload import RatePhase, TraceRequest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "sim" / "autoscale_law.json"
B = 16
MAX_REPLICAS = 16
SCALED = ("replicas-only", "genpool", "llm-d-slo")
FLAT_S = 600.0  # the oracle's sweep: this long at one rate, after the warm-up
TUNE = TuneConfig(KnobBounds(0, B, 0, B))  # the genpool policy's tuner may use the whole batch
Job = tuple[cases.Load, str, int, tuple[tuple[float, int], ...] | None, int]


def _trace(lengths: cases.Lengths) -> list[TraceRequest]:
    path = DEFAULT_TRACE if lengths.trace == "conv" else ROOT / lengths.trace
    return load_trace(path)


def _auto(load: cases.Load, schedule: tuple[tuple[float, int], ...] | None) -> AutoscaleConfig:
    return AutoscaleConfig(
        slo_ttft_p90_s=load.slo_ttft_s, target_output_tps=load.target_output_tps,
        min_replicas=2, max_replicas=MAX_REPLICAS, startup_delay_s=cases.STARTUP_S,
        interval_s=cases.INTERVAL_S, learn_days=1, schedule=schedule,
    )  # fmt: skip


def run_job(job: Job) -> dict[str, float]:
    """One policy, one seed, one load. ``flat`` / ``flat-off``: ``workers`` replicas at
    the load's low rate (the oracle's sweep; ``-off``: pausing off, pinned by bounds)."""
    load, policy, seed, schedule, workers = job
    phases, auto = load.phases(), _auto(load, schedule)
    if policy.startswith("flat"):
        phases = [RatePhase(cases.WARMUP_S + FLAT_S, load.lengths.low_rate)]
        if policy == "flat-off":
            auto = replace(auto, min_replicas=workers, max_replicas=workers, learn_days=0)
        policy = "static" if policy == "flat" else "replicas-only"
    workload = Workload(_trace(load.lengths), rate_phases=phases, cv=load.cv,
                        warmup_s=cases.WARMUP_S)  # fmt: skip
    base = ClusterConfig(workers=workers, max_batch=B, ctx_servers=load.lengths.ctx_servers)
    return run_policy(policy, base, workload, seed, auto, TUNE).metrics


def _map(jobs: Sequence[Job], workers: int) -> list[dict[str, float]]:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_job, jobs))


def _at_rate(load: cases.Load, rate: float) -> cases.Load:
    return replace(load, lengths=replace(load.lengths, low_rate=rate))


def oracle_table(load: cases.Load, seeds: int, workers: int) -> dict[str, object]:
    """Each level's fewest replicas that meet the SLO (static, pausing on, flat rate)."""
    need: dict[float, int] = {}
    sweeps: dict[str, dict[int, list[float]]] = {}
    start = 1
    for rate in cases.levels(load.lengths.low_rate):
        met_by_count: dict[int, list[float]] = {}
        count = start
        while count <= MAX_REPLICAS:
            jobs = [(_at_rate(load, rate), "flat", s, None, count) for s in range(seeds)]
            met_by_count[count] = [m["slo_windows_met"] for m in _map(jobs, workers)]
            if report.fewest_meeting({count: met_by_count[count]}) is not None:
                break
            count += 1
        found = report.fewest_meeting(met_by_count) or MAX_REPLICAS
        need[report.rate_key(rate)] = found
        sweeps[f"{rate:g}"] = met_by_count
        start = found  # a higher rate needs at least as many
    return {"need": need, "sweeps": sweeps}


def goal_load(load: cases.Load, need: dict[float, int], seeds: int, workers: int
              ) -> dict[str, object]:  # fmt: skip
    """Every policy on one load: summaries, paired ratios, the goals' verdicts."""
    phases = load.phases()
    schedule = report.oracle_schedule(phases, need)
    peak = max(need[report.rate_key(p.rate)] for p in phases)
    policies = {"static": (None, peak), "oracle": (schedule, schedule[0][1])}
    policies |= {policy: (None, 2) for policy in SCALED}
    jobs = [(load, policy, seed, table, count)
            for policy, (table, count) in policies.items() for seed in range(seeds)]  # fmt: skip
    metrics = _map(jobs, workers)
    runs = {policy: metrics[i * seeds : (i + 1) * seeds] for i, policy in enumerate(policies)}
    return {
        "load": load.name, "schedule": schedule, "static_replicas": peak,
        "summary": report.summarize(runs), "goals": report.goals(runs),
        "per_seed": runs,
    }  # fmt: skip


def pair_sweep(loads: Sequence[cases.Load], seeds: int, workers: int) -> list[dict[str, object]]:
    """genpool against replicas-only on each load: the saving that is pausing's own."""
    pairs = ("replicas-only", "genpool")
    jobs = [(load, policy, seed, None, 2) for load in loads for policy in pairs
            for seed in range(seeds)]  # fmt: skip
    metrics = _map(jobs, workers)
    rows: list[dict[str, object]] = []
    for k, load in enumerate(loads):
        chunk = metrics[k * 2 * seeds : (k + 1) * 2 * seeds]
        runs = {"replicas-only": chunk[:seeds], "genpool": chunk[seeds:]}
        rows.append({"load": load.name, "labels": load.labels,
                     "summary": report.summarize(runs),
                     "genpool_vs_replicas_only": report.paired_ratio(
                         runs, "genpool", "replicas-only")})  # fmt: skip
    return rows


def unloaded_ttft_p90(seeds: int, workers: int) -> float:
    """GEN TTFT p90 of a lightly loaded pool (L / 4 on two replicas): the SLO scale."""
    quiet = _at_rate(cases.Load("step"), cases.CONV.low_rate / 4)
    metrics = _map([(quiet, "flat", s, None, 2) for s in range(seeds)], workers)
    return sum(m["ttft_p90"] for m in metrics) / len(metrics)


def decode_rate(seeds: int, workers: int) -> float:
    """Median per-request output rate at L on three replicas, pausing off (about where
    the scaler keeps L): what T is a share of in the slack sweep."""
    metrics = _map([(cases.Load("step"), "flat-off", s, None, 3) for s in range(seeds)],
                   workers)  # fmt: skip
    return sum(m["output_rate_p50"] for m in metrics) / len(metrics)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--parts", default="goals,bursts,tightness,slack")
    parser.add_argument("--loads", default="",
                        help="goal loads to run, by name prefix (default: all)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    ns = parser.parse_args(argv)
    started = time.time()
    # resumable: each part is written as it ends, and a rerun keeps what the file has
    result: dict[str, Any] = json.loads(ns.out.read_text()) if ns.out.exists() else {}
    result.setdefault("meta", _meta(ns))
    parts = set(ns.parts.split(","))
    if "goals" in parts:
        chosen = [load for load in cases.GOAL_LOADS if load.name.startswith(ns.loads)]
        result["goals"] = _goals(chosen, ns.seeds, ns.jobs, result, ns.out)
    for part in ("bursts", "tightness", "slack"):
        if part in parts and part not in result.setdefault("sweeps", {}):
            result["sweeps"][part] = _sweep(part, ns.seeds, ns.jobs)
            _write(ns.out, result)
    result["meta"]["wall_s"] = result["meta"].get("wall_s", 0) + round(time.time() - started)
    _write(ns.out, result)
    return 0


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, allow_nan=True))
    print(f"wrote {path}", file=sys.stderr)


def _goals(
    loads: Sequence[cases.Load], seeds: int, workers: int, result: dict[str, Any], out: Path
) -> list[dict[str, object]]:
    """Each goal load's row; rows already in ``result`` (a rerun) are kept, not rerun."""
    done = {row["load"]: row for row in result.get("goals", [])}
    tables: dict[tuple[str, float], dict[str, Any]] = {}
    rows = []
    for load in loads:
        if load.name in done:
            rows.append(done[load.name])
            continue
        key = (load.lengths.name, load.cv)
        if key not in tables:
            tables[key] = oracle_table(load, seeds, workers)
        need = tables[key]["need"]
        row = goal_load(load, need, seeds, workers)
        row["oracle_sweep"] = tables[key]["sweeps"]
        rows.append(row)
        result["goals"] = rows
        _write(out, result)
        print(json.dumps({"load": load.name, "goals": row["goals"]}), file=sys.stderr)
    return rows


def _sweep(part: str, seeds: int, workers: int) -> dict[str, object]:
    """One sweep: burst length, SLO tightness or slack (module doc of autoscale_cases)."""
    if part == "bursts":
        loads = [cases.Load("bursts2x", burst_s=s, labels={"burst_s": f"{s:g}"})
                 for s in cases.BURST_LENGTHS_S]  # fmt: skip
        return {"rows": pair_sweep(loads, seeds, workers)}
    if part == "tightness":
        base = unloaded_ttft_p90(seeds, workers)
        loads = [cases.Load("ramp", slo_ttft_s=round(k * base, 3), labels={"times": f"{k:g}"})
                 for k in cases.TIGHTNESS]  # fmt: skip
        return {"unloaded_ttft_p90": base, "rows": pair_sweep(loads, seeds, workers)}
    rate = decode_rate(seeds, workers)
    loads = [cases.Load("ramp", target_output_tps=round(k * rate, 2), labels={"share": f"{k:g}"})
             for k in cases.SLACK]  # fmt: skip
    return {"decode_rate": rate, "rows": pair_sweep(loads, seeds, workers)}


def _meta(ns: argparse.Namespace) -> dict[str, Any]:
    return {**provenance("bench.autoscale_study"), "seeds": ns.seeds, "startup_s": cases.STARTUP_S,
            "interval_s": cases.INTERVAL_S, "warmup_s": cases.WARMUP_S,
            "min_windows_met": report.MIN_WINDOWS_MET, "max_replicas": MAX_REPLICAS,
            "nan": math.nan}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
