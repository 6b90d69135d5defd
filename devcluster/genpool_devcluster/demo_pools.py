"""The demo's two pools and its settings, as data, and the cost summary over their runs.

Pure: ``demo.py`` applies these specs and runs the load, ``bench/sim_demo_load.py`` runs the
same load and SLO in the simulator (docs/demo.md). Both pools state one SLO and one set of
autoscaling bounds and run the replica scaler at its shipped defaults (the capacity
learned, no targetUtilization); they differ in preemption (and so in the tuner, which has
no knobs without it). ``targetUtilization`` is only an expert override a user may pass.
"""

from __future__ import annotations

from typing import Any

from genpool_devcluster.demo_load import Phase, PoolRun
from genpool_devcluster.demo_report import (
    attainment,
    meets_slo,
    replica_seconds,
    slo_windows,
    ttft_p90,
)

GENPOOL, REPLICAS_ONLY = "genpool", "replicas-only"
POOLS = (GENPOOL, REPLICAS_ONLY)
TARGET_TPS, SLO_TTFT_S, SLO_ATTAINMENT = 10.0, 1.5, 0.8
SLO_WINDOW_S = 10.0  # the summary's SLO windows: 10 s of arrivals each
MIN_REPLICAS, MAX_REPLICAS = 2, 3
# The devcluster's synthetic workers serve 15-20 s after a scale-up: the pools state it
# (spec.autoscaling.startupSeconds, the scaler's horizon), and the simulator's run of this
# load (bench/sim_demo_load.py) starts its replicas that late.
STARTUP_S = 15
# The burst is two phases, so the table shows the pool before and after it scaled up.
PHASES = (
    Phase("quiet", 45, 1.0),
    Phase("burst", 40, 6.0),
    Phase("burst, later", 50, 6.0),
    Phase("quiet again", 150, 1.0),
)
BASE_SPEC: dict[str, Any] = {
    "replicas": 1,
    "model": "synthetic:demo",
    "accelerator": "none",
    "engine": {"maxBatchSize": 8, "maxSeqLen": 512},
    # Short windows: the scaler and the tuner act on 5 s of stat lines.
    "tuning": {"intervalSeconds": 5, "cooldownIntervals": 1},
    "drain": {"timeoutSeconds": 60},
    "podTemplate": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]},
}


def pool_specs(
    utilization: dict[str, float] | None = None,
    min_replicas: int = MIN_REPLICAS,
    slo_ttft_s: float = SLO_TTFT_S,
) -> dict[str, dict[str, Any]]:
    """The two pools: the same SLO, bounds and engine, the scaler at its defaults; they
    differ in preemption (and so in the tuner, which has no knobs without it).
    ``utilization``: a pool's expert override (spec.autoscaling.targetUtilization), which
    pins the capacity the scaler would otherwise learn."""
    ceilings = utilization or {}
    autoscaling = {
        "enabled": True,
        "minReplicas": min_replicas,
        "maxReplicas": MAX_REPLICAS,
        "startupSeconds": STARTUP_S,
    }
    preemption = {
        GENPOOL: {"mode": "TargetOutputTps", "targetOutputTps": TARGET_TPS},
        REPLICAS_ONLY: {"mode": "Off"},
    }
    specs = {}
    for name in POOLS:
        ceiling = ceilings.get(name)
        scaler = autoscaling if ceiling is None else autoscaling | {"targetUtilization": ceiling}
        specs[name] = BASE_SPEC | {
            "replicas": min_replicas,  # where the scaler would start it anyway
            "preemption": preemption[name],
            "slo": {"ttftP90Seconds": slo_ttft_s, "attainment": SLO_ATTAINMENT},
            "autoscaling": scaler,
        }
    return specs


def cost_summary(
    runs: dict[str, PoolRun], end_s: float, slo_ttft_s: float = SLO_TTFT_S
) -> dict[str, Any]:
    """Each pool's replica-seconds and SLO windows met, and the ratio of replica-seconds."""
    pools: dict[str, Any] = {}
    for name, (sent, samples) in runs.items():
        met, total = slo_windows(sent, SLO_WINDOW_S, slo_ttft_s, SLO_ATTAINMENT, TARGET_TPS)
        p90, attained = ttft_p90(sent), attainment(sent, TARGET_TPS)
        pools[name] = {
            "replica_seconds": round(replica_seconds(samples, end_s), 1),
            "ttft_p90_s": None if p90 is None else round(p90, 4),
            "attainment": None if attained is None else round(attained, 4),
            "slo_met": meets_slo(sent, slo_ttft_s, SLO_ATTAINMENT, TARGET_TPS),
            "slo_windows_met": met,
            "slo_windows": total,
        }
    ours, theirs = (pools[n]["replica_seconds"] for n in POOLS) if len(pools) > 1 else (0, 0)
    ratio = round(ours / theirs, 3) if theirs else None
    return {"pools": pools, "ratio": ratio, "slo_ttft_p90_s": slo_ttft_s}


def format_cost(cost: dict[str, Any]) -> str:
    lines = [f"Replica-seconds over the load (worker pods ready, starting or draining) and SLO "
             f"windows met ({SLO_WINDOW_S:g} s of arrivals: p90 TTFT <= "
             f"{cost['slo_ttft_p90_s']:g} s, "
             f">= {SLO_ATTAINMENT:.0%} at their floor, none failed):"]  # fmt: skip
    for name, pool in cost["pools"].items():
        share = pool["slo_windows_met"] / pool["slo_windows"] if pool["slo_windows"] else 0.0
        verdict = "met" if pool["slo_met"] else "MISSED"
        lines.append(f"  {name:14} {pool['replica_seconds']:8.1f} replica-s   SLO over the whole "
                     f"load {verdict} (p90 TTFT {_num(pool['ttft_p90_s'])} s, attainment "
                     f"{_num(pool['attainment'])})   SLO windows met "
                     f"{pool['slo_windows_met']}/{pool['slo_windows']} ({share:.0%})")  # fmt: skip
    if cost["ratio"] is not None:
        lines.append(f"  ratio {GENPOOL} / {REPLICAS_ONLY}: {cost['ratio']:.3f} "
                     f"({1 - cost['ratio']:+.1%} replica-seconds saved by pausing)")  # fmt: skip
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
