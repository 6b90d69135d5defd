"""Tuner in the loop: tuned vs static knobs on a load that rises and falls.

    python -m bench.sim_tune                      # writes bench/results/sim/tune.json
    python -m bench.sim_tune --seeds 1 --phases 60:200,60:270 --warmup 10 --out /tmp/t.json

Per seed: ``off`` (defines T = auto), SLO mode with the static default knobs
(P = H = floor(0.375 A) = 6), and SLO mode with the operator's tuner every 30 s
(docs/design.md#tuner) under several rules / bounds. Whole-window metrics as ``genpool sim``
reports them, plus per-phase TTFT p90 / below-T / TPOT from the request records.
"""

from __future__ import annotations

import argparse
import json
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.provenance import provenance
from genpool_core.knobs import KnobBounds
from genpool_core.quantiles import percentile
from genpool_core.tuner import TunerSettings
from genpool_sim.cli import DEFAULT_TRACE, load_trace
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import RunResult, Workload, run_seed
from genpool_sim.phases import Phase, parse_phases, phase_starts
from genpool_sim.pool_control import TuneConfig
from genpool_sim.records import SimRequest
from genpool_sim.report import mean_ci

OUT = Path(__file__).resolve().parent / "results" / "sim" / "tune.json"
PHASES = "150:200,300:270,150:200"
METRICS = ("ttft_p90", "admission_wait_p99", "tpot_mean", "below_target",
           "output_tokens_per_s", "e2e_p90")  # fmt: skip
VARIANTS: dict[str, TuneConfig | None] = {
    "static": None,
    "tuned": TuneConfig(KnobBounds(0, 16, 0, 16)),
    "tuned_cap8": TuneConfig(KnobBounds(0, 8, 0, 8)),
    "tuned_literal": TuneConfig(KnobBounds(0, 16, 0, 16), settings=TunerSettings(guarded=False)),
}


def _per_phase(records: list[SimRequest], phases: list[Phase], t: float) -> list[dict[str, float]]:
    out = []
    for start, phase in zip(phase_starts(phases), phases, strict=True):
        done = [r for r in records if start <= r.arrival < start + phase.duration_s]
        ttft = [v for r in done if (v := r.ttft) is not None]
        tpot = [v for r in done if (v := r.tpot) is not None]
        rates = [v for r in done if (v := r.output_rate) is not None]
        out.append({
            "clients": phase.clients, "requests": len(done),
            "ttft_p90": percentile(ttft, 90),
            "tpot_mean": sum(tpot) / len(tpot) if tpot else math.nan,
            "below_target": sum(r < t for r in rates) / len(rates) if rates else math.nan,
        })  # fmt: skip
    return out


def _seed_job(args: tuple[Workload, int]) -> dict[str, Any]:
    workload, seed = args
    assert workload.phases is not None
    phases = list(workload.phases)
    base = ClusterConfig()
    first = run_seed(base, workload, ["off", "target_output_tps"], seed, keep_records=True)
    target = first[0].target_output_tps
    assert target is not None
    runs: dict[str, RunResult] = {"off": first[0], "static": first[1]}
    for name, tune in VARIANTS.items():
        if tune is not None:
            runs[name] = run_seed(base, workload, ["target_output_tps"], seed, target,
                                  keep_records=True, tune=tune)[0]  # fmt: skip
    return {name: {
        "metrics": run.metrics,
        "phases": _per_phase(run.records, phases, target),
        "changes": sum(1 for d in run.tuning if d["changed"]),
        "max_cap": max((int(str(d["cap"])) for d in run.tuning), default=None),
        "decisions": run.tuning,
        "target_output_tps": target,
    } for name, run in runs.items()}  # fmt: skip


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in per_seed[0]:
        entry: dict[str, Any] = {}
        for metric in METRICS:
            values = [seed[name]["metrics"][metric] for seed in per_seed]
            mean, ci = mean_ci(values)
            deltas = [s[name]["metrics"][metric] - s["static"]["metrics"][metric] for s in per_seed]
            d_mean, d_ci = mean_ci(deltas)
            entry[metric] = {"mean": mean, "ci95": ci, "delta_vs_static": d_mean,
                             "delta_ci95": d_ci}  # fmt: skip
        entry["changes"] = mean_ci([float(s[name]["changes"]) for s in per_seed])[0]
        phases = len(per_seed[0][name]["phases"])
        entry["phases"] = [
            {k: mean_ci([s[name]["phases"][i][k] for s in per_seed])[0]
             for k in ("clients", "ttft_p90", "tpot_mean", "below_target")}
            for i in range(phases)
        ]  # fmt: skip
        summary[name] = entry
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--phases", default=PHASES)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=OUT)
    ns = parser.parse_args()
    source = provenance("bench.sim_tune")
    workload = Workload(load_trace(DEFAULT_TRACE), phases=parse_phases(ns.phases),
                        warmup_s=ns.warmup)  # fmt: skip
    with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
        per_seed = list(pool.map(_seed_job, [(workload, s) for s in range(ns.seeds)]))
    document = {
        **source, "phases": ns.phases, "warmup_s": ns.warmup, "seeds": ns.seeds,
        "variants": {k: None if v is None else {"bounds": vars_of(v.bounds),
                     "guarded": v.settings.guarded, "interval_s": v.interval_s}
                     for k, v in VARIANTS.items()},
        "summary": summarize(per_seed), "per_seed": per_seed,
    }  # fmt: skip
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(document, indent=1, allow_nan=True))
    print(json.dumps(document["summary"], indent=1))
    return 0


def vars_of(bounds: KnobBounds) -> dict[str, int]:
    # The result files keep their original key names.
    return {"headroom_min": bounds.min_resident_headroom,
            "headroom_max": bounds.max_resident_headroom,
            "cap_min": bounds.min_paused_cap, "cap_max": bounds.max_paused_cap}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
