"""Prefix caching in the simulator (docs/results.md, "Prefix caching in the simulator").

    python -m bench.sim_prefix             # 4 seeds, a few minutes on 2 shared cores; writes
                                           # bench/results/sim/prefix.json
    python -m bench.sim_prefix --table     # the doc's tables from that JSON
    python -m bench.sim_prefix --seeds 2 --duration 200 --warmup 30 --out /tmp/prefix.json
    python -m bench.sim_prefix --loads 1.0:tight,1.0:h200

Multi-turn conversations (``genpool_sim.conversations``): one 1024-token system prompt
shared by every conversation, 4 turns on average (geometric), 10 s mean think time, user
messages of a quarter of an Azure conversation prompt and Azure replies, at most 8192
tokens of context; Poisson conversation starts (1.3 and 1.6 a second); 400 s, 60 s of
warm-up. W = 4 colocated GEN workers (each prefills its own prompts), B = 16, H = P = 6,
at equal KV memory per worker: tight (3072 blocks of 16 = 6.4 GB at the Llama-3.1-8B bf16
shape) and one H200's (51498).
Per seed: caching off, on with the least-loaded router, on with the prefix-aware router;
each in mode ``off`` and in SLO mode (``target_output_tps``) with the T of that seed's
caching-off ``off`` run (T = auto), so every variant is held to the same T at the same
conversations.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.provenance import provenance
from genpool_core.names import OFF_MODE, SLO_MODE
from genpool_sim.cli import DEFAULT_TRACE, load_trace
from genpool_sim.cluster import ClusterConfig
from genpool_sim.conversations import ConversationSettings
from genpool_sim.experiment import Workload, run_seed
from genpool_sim.gen_pass import LEAST_LOADED, PREFIX_AWARE
from genpool_sim.kv_memory import H200_LLAMA_8B_KV_BYTES, LLAMA_31_8B_BF16
from genpool_sim.report import mean_ci

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "sim" / "prefix.json"
BUDGETS = {
    "tight": 3072,
    "h200": LLAMA_31_8B_BF16.budget_for(H200_LLAMA_8B_KV_BYTES, 16).num_blocks,
}
SYSTEM_PROMPT_TOKENS = 1024
BASE = ClusterConfig(workers=4, max_batch=16, colocated=True)
METRICS = ("prefix_hit_rate", "prefix_oracle_hit_rate", "residents_mean", "kv_resident_capacity",
           "ttft_turns2_p50", "ttft_turns2_p90", "ttft_turn1_p90", "kv_paused_share",
           "kv_paused_only_share", "pauses_per_request", "below_target", "kv_memory_bound",
           "output_tokens_per_s", "requests")  # fmt: skip


@dataclass(frozen=True)
class Variant:
    label: str
    is_caching: bool
    router: str


VARIANTS = {
    "off": Variant("caching off", False, LEAST_LOADED),
    "on": Variant("caching on, least-loaded router", True, LEAST_LOADED),
    "on_aware": Variant("caching on, prefix-aware router", True, PREFIX_AWARE),
}


def _seed_job(args: tuple[Workload, int, int]) -> dict[str, Any]:
    """One seed of one load and budget: T from the caching-off off run, then every variant
    in both modes at that T."""
    workload, blocks, seed = args
    base = replace(BASE, kv_blocks=blocks)
    out: dict[str, Any] = {}
    target = None
    for name, variant in VARIANTS.items():
        config = replace(base, prefix_caching=variant.is_caching, router=variant.router)
        runs = run_seed(config, workload, [OFF_MODE, SLO_MODE], seed, target)
        target = runs[0].target_output_tps if target is None else target
        out[name] = {run.mode: run.metrics for run in runs}
    out["target_output_tps"] = target
    return out


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """variant -> mode -> metric -> mean ± 95 % CI over seeds."""
    summary: dict[str, Any] = {}
    for name in VARIANTS:
        summary[name] = {}
        for mode in (OFF_MODE, SLO_MODE):
            runs = [seed[name][mode] for seed in per_seed]
            summary[name][mode] = {
                key: _stat([r[key] for r in runs if key in r]) for key in METRICS
            }
    summary["target_output_tps"] = _stat([seed["target_output_tps"] for seed in per_seed])
    return summary


def _stat(values: list[float]) -> dict[str, float]:
    mean, ci = mean_ci(values)
    return {"mean": mean, "ci95": ci}


def _pm(entry: dict[str, float], scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    return f"{entry['mean'] * scale:.{digits}f} ± {entry['ci95'] * scale:.{digits}f}{unit}"


COLUMNS = (  # (metric, header, scale, digits, unit)
    ("prefix_hit_rate", "hit rate", 100, 1, " %"),
    ("prefix_oracle_hit_rate", "oracle", 100, 1, " %"),
    ("residents_mean", "residents mean", 1, 1, ""),
    ("kv_resident_capacity", "residents the KV holds", 1, 1, ""),
    ("ttft_turns2_p50", "TTFT p50 s, turns >= 2", 1, 2, ""),
    ("ttft_turns2_p90", "TTFT p90 s, turns >= 2", 1, 2, ""),
    ("kv_paused_share", "KV paused", 100, 2, " %"),
    ("kv_paused_only_share", "KV paused only", 100, 2, " %"),
    ("pauses_per_request", "pauses/req", 1, 3, ""),
    ("below_target", "below T", 100, 1, " %"),
)


def table(summary: dict[str, Any]) -> str:
    """A row per variant and mode, mean ± 95 % CI over seeds."""
    lines = ["| variant | mode | " + " | ".join(c[1] for c in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]  # fmt: skip
    for name, variant in VARIANTS.items():
        for mode in (OFF_MODE, SLO_MODE):
            cells = [_pm(summary[name][mode][key], scale, digits, unit)
                     for key, _, scale, digits, unit in COLUMNS]  # fmt: skip
            lines.append(f"| {variant.label} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(ns: argparse.Namespace) -> dict[str, Any]:
    trace = load_trace(DEFAULT_TRACE)
    loads = [(float(rate), budget) for rate, _, budget in
             (item.partition(":") for item in ns.loads.split(","))]  # fmt: skip
    jobs = []
    for rate, budget in loads:
        settings = ConversationSettings(rate, system_prompt_tokens=SYSTEM_PROMPT_TOKENS)
        workload = Workload(trace, conversations=settings, duration_s=ns.duration,
                            warmup_s=ns.warmup)  # fmt: skip
        jobs += [(workload, BUDGETS[budget], seed) for seed in range(ns.seeds)]
    with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
        per_seed = list(pool.map(_seed_job, jobs))
    results = {}
    for i, (rate, budget) in enumerate(loads):
        seeds = per_seed[i * ns.seeds : (i + 1) * ns.seeds]
        results[f"{rate:g} conversations/s, {budget} KV ({BUDGETS[budget]} blocks)"] = {
            "summary": summarize(seeds), "per_seed": seeds}  # fmt: skip
    return {
        **provenance("bench.sim_prefix"),
        "seeds": ns.seeds, "duration_s": ns.duration, "warmup_s": ns.warmup,
        "workers": BASE.workers, "max_batch": BASE.max_batch, "block_size": BASE.kv_block_size,
        "conversations": {"system_prompt_tokens": SYSTEM_PROMPT_TOKENS, "turns": settings.turns,
                          "think_s": settings.think_s, "message_scale": settings.message_scale,
                          "max_context_tokens": settings.max_context_tokens},
        "variants": {k: {"label": v.label, "prefix_caching": v.is_caching, "router": v.router}
                     for k, v in VARIANTS.items()},
        "loads": results,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--loads", default="1.3:tight,1.6:tight,1.3:h200",
                        help="RATE:BUDGET,...: conversations started per second and the KV"
                        f" budget, among {', '.join(BUDGETS)}")  # fmt: skip
    parser.add_argument("--duration", type=float, default=400.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--table", action="store_true", help="print the tables of --out")
    ns = parser.parse_args()
    if not ns.table:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps(run(ns), indent=1, allow_nan=True))
    document = json.loads(ns.out.read_text())
    for load, result in document["loads"].items():
        target = result["summary"]["target_output_tps"]["mean"]
        print(f"\n{load}, T = {target:.2f} tok/s, {document['seeds']} seeds\n\n"
              f"{table(result['summary'])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
