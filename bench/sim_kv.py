"""What resident headroom costs in KV memory at R1 (docs/results.md, "KV memory at R1").

    python -m bench.sim_kv                 # 4 seeds, ~17 min on 2 shared cores; writes
                                           # bench/results/sim/kv_headroom.json
    python -m bench.sim_kv --table         # the doc's tables from that JSON
    python -m bench.sim_kv --seeds 2 --duration 120 --warmup 20 --out /tmp/kv.json

R1 (c = 220 and 250, W = 8, B = 16, n_ctx = 4, Azure conv lengths, 600 s, 60 s warm-up)
in SLO mode with T = auto (the off run without a KV budget, same seed), for several
resident headrooms H = P = floor(f A) and the tuner (bounds 0..16), each without a KV
budget and with one worker's KV at the Llama-3.1-8B shape on one H200
(``genpool_sim.kv_memory``: 108 GB / (128 KiB x 16 tokens) = 51498 blocks); and at a tight
budget where memory binds. Block counts become GB at that shape.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.provenance import provenance
from genpool_core.knobs import KnobBounds
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE, OFF_MODE, SLO_MODE
from genpool_sim.cli import DEFAULT_TRACE, load_trace
from genpool_sim.cluster import ClusterConfig
from genpool_sim.experiment import Workload, run_seed
from genpool_sim.kv_memory import GB, H200_LLAMA_8B_KV_BYTES, LLAMA_31_8B_BF16
from genpool_sim.pool_control import TuneConfig
from genpool_sim.report import mean_ci

OUT = Path(__file__).resolve().parent / "results" / "sim" / "kv_headroom.json"
SHAPE, BLOCK = LLAMA_31_8B_BF16, DEFAULT_KV_BLOCK_SIZE
H200_BLOCKS = SHAPE.budget_for(H200_LLAMA_8B_KV_BYTES, BLOCK).num_blocks
# Tight: 2048 blocks = 32768 tokens = 4.3 GB, about 22 residents of the trace's mean
# 1366 + 1 block-rounding tokens at H = 6, and still > the longest request (881 blocks).
TIGHT_BLOCKS = 2048
TUNER = TuneConfig(KnobBounds(0, 16, 0, 16))
OUTCOMES = ("below_target", "ttft_p90", "admission_wait_p99", "tpot_mean",
            "output_tokens_per_s", "e2e_p90")  # fmt: skip
KV_BLOCK_METRICS = ("kv_used_blocks_mean", "kv_paused_blocks_mean", "kv_paused_blocks_p99")
KV_SHARES = ("kv_used_share", "kv_memory_bound", "kv_caps_bound")


@dataclass(frozen=True)
class Variant:
    label: str
    paused_cap_fraction: float  # H = P = floor(f A) at the start
    kv_blocks: int | None
    tune: TuneConfig | None = None
    unbudgeted: str | None = None  # the same setting without a KV budget (paired)


def _variants() -> dict[str, Variant]:
    out: dict[str, Variant] = {}
    for name, fraction, tune in (("H0", 0.0, None), ("H6", 0.375, None),
                                 ("H12", 0.75, None), ("tuned", 0.375, TUNER)):  # fmt: skip
        out[name] = Variant(f"{name}, no KV budget", fraction, None, tune)
        out[f"{name}_kv"] = Variant(f"{name}, H200 KV", fraction, H200_BLOCKS, tune, name)
    for name, fraction in (("H0", 0.0), ("H6", 0.375)):
        out[f"{name}_tight"] = Variant(f"{name}, {TIGHT_BLOCKS} blocks", fraction,
                                       TIGHT_BLOCKS, None, name)  # fmt: skip
    return out


VARIANTS = _variants()


def _seed_job(args: tuple[Workload, int]) -> dict[str, Any]:
    """One seed of one load: the off run (T = auto), then every variant at that T."""
    workload, seed = args
    base = ClusterConfig()
    off = run_seed(base, workload, [OFF_MODE], seed)[0]
    target = off.target_output_tps
    out: dict[str, Any] = {"off": {"metrics": off.metrics, "target_output_tps": target}}
    for name, variant in VARIANTS.items():
        config = replace(base, paused_cap_fraction=variant.paused_cap_fraction,
                         kv_blocks=variant.kv_blocks)  # fmt: skip
        run = run_seed(config, workload, [SLO_MODE], seed, target, tune=variant.tune)[0]
        knobs = [(int(str(d["headroom"])), int(str(d["cap"]))) for d in run.tuning]
        out[name] = {"metrics": run.metrics, "final_knobs": knobs[-1] if knobs else None}
    return out


def _gb(blocks: float) -> float:
    return SHAPE.gb(blocks, BLOCK)


def _stat(values: list[float]) -> dict[str, float]:
    mean, ci = mean_ci(values)
    return {"mean": mean, "ci95": ci}


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: mean ± 95 % CI over seeds; KV in GB; a budgeted variant's paired
    deltas against the same setting unbudgeted, and whether every seed came out the same."""
    summary: dict[str, Any] = {}
    for name, variant in VARIANTS.items():
        runs = [seed[name]["metrics"] for seed in per_seed]
        entry: dict[str, Any] = {key: _stat([r[key] for r in runs]) for key in OUTCOMES}
        if variant.kv_blocks is not None:
            entry["kv_blocks"] = variant.kv_blocks
            entry["kv_gb"] = _gb(variant.kv_blocks)
            for key in KV_BLOCK_METRICS:
                entry[key.replace("blocks", "gb")] = _stat([_gb(r[key]) for r in runs])
            entry |= {key: _stat([r[key] for r in runs]) for key in KV_SHARES}
        if variant.unbudgeted is not None:
            bases = [seed[variant.unbudgeted]["metrics"] for seed in per_seed]
            entry["identical_to_unbudgeted"] = all(
                r[k] == b[k] for r, b in zip(runs, bases, strict=True) for k in b
            )
            entry["delta_vs_unbudgeted"] = {
                key: _stat([r[key] - b[key] for r, b in zip(runs, bases, strict=True)])
                for key in OUTCOMES
            }
        knobs = [seed[name]["final_knobs"] for seed in per_seed if seed[name]["final_knobs"]]
        if knobs:
            entry["final_knobs"] = knobs
        summary[name] = entry
    summary["off"] = {key: _stat([s["off"]["metrics"][key] for s in per_seed])
                      for key in OUTCOMES}  # fmt: skip
    summary["off"]["target_output_tps"] = _stat([s["off"]["target_output_tps"] for s in per_seed])
    return summary


def _pm(entry: dict[str, float], scale: float = 1.0, digits: int = 2) -> str:
    return f"{entry['mean'] * scale:.{digits}f} ± {entry['ci95'] * scale:.{digits}f}"


def _bound(entry: dict[str, Any]) -> str:
    if "kv_memory_bound" not in entry:
        return "B, H (no memory limit)"
    memory, caps = entry["kv_memory_bound"]["mean"], entry["kv_caps_bound"]["mean"]
    return f"memory {100 * memory:.1f} % / B, H {100 * caps:.1f} %"


def _knobs(entry: dict[str, Any]) -> str:
    finals = entry.get("final_knobs")
    if not finals:
        return ""
    heads = sorted(h for h, _ in finals)
    span = f"{heads[0]}-{heads[-1]}" if heads[0] != heads[-1] else f"{heads[0]}"
    return f" (final H = P: {span})"


def _cells(e: dict[str, Any], variant: Variant) -> tuple[str, str, str]:
    if variant.kv_blocks is None:
        return "-", "-", "-"
    used = _pm(e["kv_used_share"], 100, 2) + " %"
    if variant.paused_cap_fraction == 0:  # P = 0: nothing is ever paused
        return "0 (P = 0)", "0 (P = 0)", used
    return _pm(e["kv_paused_gb_mean"]), _pm(e["kv_paused_gb_p99"]), used


def _outcome(e: dict[str, Any], key: str, scale: float, digits: int, unit: str) -> str:
    text = f"{_pm(e[key], scale, digits)}{unit}"
    delta = e.get("delta_vs_unbudgeted", {}).get(key)
    if delta is not None and not e.get("identical_to_unbudgeted"):
        text += f" ({delta['mean'] * scale:+.{digits}f} ± {delta['ci95'] * scale:.{digits}f})"
    return text


def table(summary: dict[str, Any]) -> str:
    """The doc's table for one load: a row per variant; a budgeted row that differs from
    its unbudgeted twin gives the paired delta in brackets."""
    lines = [
        "| setting | paused KV mean GB | paused KV p99 GB | KV used | waiting head held by"
        " | below T | TTFT p90 s | tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, variant in VARIANTS.items():
        e = summary[name]
        paused_mean, paused_p99, used = _cells(e, variant)
        same = " (= no budget, every seed)" if e.get("identical_to_unbudgeted") else ""
        outcomes = (_outcome(e, "below_target", 100, 1, " %"), _outcome(e, "ttft_p90", 1, 2, ""),
                    _outcome(e, "output_tokens_per_s", 1, 1, ""))  # fmt: skip
        lines.append(
            f"| {variant.label}{_knobs(e)}{same} | {paused_mean} | {paused_p99} | {used} | "
            f"{_bound(e)} | " + " | ".join(outcomes) + " |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--concurrency", default="220,250")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--table", action="store_true", help="print the tables of --out")
    ns = parser.parse_args()
    if not ns.table:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        source = provenance("bench.sim_kv")
        ns.out.write_text(json.dumps({**source, **run(ns)}, indent=1, allow_nan=True))
    document = json.loads(ns.out.read_text())
    for load, result in document["loads"].items():
        print(f"\n{load}, T = {result['summary']['off']['target_output_tps']['mean']:.2f}"
              f" tok/s, {document['seeds']} seeds\n\n{table(result['summary'])}")  # fmt: skip
    return 0


def run(ns: argparse.Namespace) -> dict[str, Any]:
    trace = load_trace(DEFAULT_TRACE)
    loads = [int(c) for c in ns.concurrency.split(",")]
    jobs = [(Workload(trace, concurrency=c, duration_s=ns.duration, warmup_s=ns.warmup), seed)
            for c in loads for seed in range(ns.seeds)]  # fmt: skip
    with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
        per_seed = list(pool.map(_seed_job, jobs))
    results = {}
    for i, c in enumerate(loads):
        seeds = per_seed[i * ns.seeds : (i + 1) * ns.seeds]
        results[f"c={c}"] = {"summary": summarize(seeds), "per_seed": seeds}
    return {
        "seeds": ns.seeds, "duration_s": ns.duration, "warmup_s": ns.warmup,
        "shape": {"bytes_per_token": SHAPE.bytes_per_token, "block_size": BLOCK,
                  "kv_bytes": H200_LLAMA_8B_KV_BYTES, "gb": GB},
        "variants": {k: {"label": v.label, "paused_cap_fraction": v.paused_cap_fraction,
                         "kv_blocks": v.kv_blocks, "tuned": v.tune is not None}
                     for k, v in VARIANTS.items()},
        "loads": results,
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
