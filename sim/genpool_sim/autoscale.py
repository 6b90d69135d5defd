"""Replicas that come and go (``genpool sim --autoscale``): the three policies the
pool controller is measured with.

Every ``interval_s`` the operator's pool controller runs in the simulator's loop
(:class:`genpool_sim.pool_control.SimPool`: the stat lines, then the same
:func:`genpool_core.controller.run_round` the operator ships); the cluster adds
replicas (serving after the start-up delay) or drains them.

Policies, on the same seeds:

- ``static``: ``--workers`` fixed, pausing on (the SLO mode), no tuner: sized for
  the peak, the cost ceiling;
- ``replicas-only``: pausing off, the scaler on the TTFT target alone (the planner
  idea of Dynamo, llm-d, KEDA);
- ``genpool``: pausing, the knob tuner and the scaler on both parts of the SLO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from genpool_core.field_help import DESCRIPTION, describe
from genpool_core.names import OFF_MODE, SLO_MODE
from genpool_core.quantiles import percentile
from genpool_core.scaler import ScalerSettings
from genpool_sim.cluster import Cluster, ClusterConfig
from genpool_sim.experiment import Workload, measure, simulate
from genpool_sim.pool_control import SimPool, TuneConfig
from genpool_sim.report import mean_ci

POLICIES = ("static", "replicas-only", "genpool")
SUMMARY_METRICS = (
    "replica_seconds",
    "slo_windows_met",
    "ttft_p90",
    "below_target",
    "tpot_mean",
    "output_tokens_per_s",
)


@dataclass(frozen=True)
class AutoscaleConfig:
    """The SLO and the scaler's settings of the policies (``scaler_settings``); the
    utilisation ceilings default to the scaler's, bench/sim_autoscale_sweep.py tunes each
    to its SLO."""

    slo_ttft_p90_s: float = field(metadata={DESCRIPTION: describe(ScalerSettings, "ttft_p90_s")})
    target_output_tps: float = field(
        metadata={
            DESCRIPTION: "T, output tokens/s per request: attainment is the share of requests"
            " at or above it; the static and genpool policies pause for it"
        }
    )
    min_replicas: int = field(
        metadata={
            DESCRIPTION: "fewest replicas the scaler keeps; the replicas-only and genpool"
            " policies start with this many"
        }
    )
    max_replicas: int = field(metadata={DESCRIPTION: describe(ScalerSettings, "max_replicas")})
    attainment: float = field(
        default=0.8,
        metadata={
            DESCRIPTION: "SLO: least share of the requests at or above T (1 - eps), in (0, 1),"
            " in every policy's SLO windows; the genpool policy's scaler scales on it,"
            " replicas-only's on GEN TTFT alone"
        },
    )
    startup_delay_s: float = field(
        default=60.0,
        metadata={
            DESCRIPTION: "simulated seconds from adding a replica to its serving (model load)"
        },
    )
    interval_s: float = field(
        default=30.0,
        metadata={
            DESCRIPTION: "simulated seconds between pool-controller rounds: the scaler's, and"
            " the genpool policy's tuner's"
        },
    )
    slo_window_s: float = field(
        default=60.0,
        metadata={
            DESCRIPTION: "the windows the SLO is scored in (SLO windows met), simulated seconds"
        },
    )
    planner_max_utilisation: float = field(
        default=0.85,
        metadata={
            DESCRIPTION: "replicas-only: the share of the batch positions the load (batch,"
            " waiting) may fill, with headroom for bursts, unitless"
        },
    )
    genpool_max_utilisation: float = field(
        default=0.95,
        metadata={
            DESCRIPTION: "genpool: the share of the batch positions the load (batch, paused,"
            " waiting) may fill, higher since pausing absorbs the bursts, unitless"
        },
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.startup_delay_s) and self.startup_delay_s >= 0):
            raise ValueError(f"start-up delay must be >= 0 s, got {self.startup_delay_s}")
        if not (math.isfinite(self.target_output_tps) and self.target_output_tps > 0):
            raise ValueError(f"T must be > 0 tok/s, got {self.target_output_tps}")
        self.scaler_settings(1)  # validates the SLO and the replica bounds

    def scaler_settings(
        self, max_batch: int, *, knobs: bool = True, cap_max: int | None = None
    ) -> ScalerSettings:
        """``knobs=False``: the replica-only planner (TTFT alone, no knob lever)."""
        return ScalerSettings(
            ttft_p90_s=self.slo_ttft_p90_s,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            max_batch=max_batch,
            attainment=self.attainment if knobs else None,
            cap_max=cap_max if knobs else None,
            max_utilisation=self.planner_max_utilisation,
            max_utilisation_with_pausing=self.genpool_max_utilisation,
            interval_s=self.interval_s,
        )


@dataclass
class PolicyRun:
    policy: str
    seed: int
    metrics: dict[str, float]
    timeline: list[dict[str, object]] = field(default_factory=list)


def run_policy(
    policy: str,
    base: ClusterConfig,
    workload: Workload,
    seed: int,
    auto: AutoscaleConfig,
    tune: TuneConfig,
) -> PolicyRun:
    """One policy on one seed. ``base.workers`` is the static pool's size."""
    slo = replace(base, mode=SLO_MODE, target_output_tps=auto.target_output_tps)
    interval, delay = auto.interval_s, auto.startup_delay_s
    if policy == "static":  # observed, never scaled
        config, pool = slo, SimPool(interval)
    elif policy == "replicas-only":
        config = replace(base, mode=OFF_MODE, workers=auto.min_replicas)
        pool = SimPool(interval, None, auto.scaler_settings(base.max_batch, knobs=False), delay)
    elif policy == "genpool":
        bounds = tune.bounds
        config = replace(slo, workers=auto.min_replicas,
                         max_resident_headroom=bounds.max_resident_headroom)  # fmt: skip
        settings = auto.scaler_settings(base.max_batch, cap_max=bounds.max_paused_cap)
        tuner = TuneConfig(bounds, interval, tune.settings)
        pool = SimPool(interval, tuner, settings, delay)
    else:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    cluster = simulate(config, workload, seed, pool)
    return PolicyRun(policy, seed, policy_metrics(cluster, workload, auto), pool.timeline)


def policy_metrics(cluster: Cluster, workload: Workload, auto: AutoscaleConfig) -> dict[str, float]:
    """The summary's metrics; TTFT here is the SLO's: GEN arrival -> first GEN token."""
    base, done = measure(cluster, workload, auto.target_output_tps)
    start, end = workload.warmup_s, workload.duration_s
    gen_ttft = [r.gen_ttft for r in done if r.gen_ttft is not None]
    windows = slo_windows(cluster, auto, start, end)
    return {
        "replica_seconds": cluster.replica_seconds(start, end),
        "mean_replicas": cluster.replica_seconds(start, end) / (end - start),
        "slo_windows_met": sum(windows) / len(windows) if windows else math.nan,
        "ttft_p90": percentile(gen_ttft, 90),
        "ttft_p99": percentile(gen_ttft, 99),
        "ttft_from_arrival_p90": base["ttft_p90"],
        "below_target": base.get("below_target", math.nan),
        "tpot_mean": base["tpot_mean"],
        "output_tokens_per_s": base["output_tokens_per_s"],
        "requests": base["requests"],
    }


def slo_windows(cluster: Cluster, auto: AutoscaleConfig, start: float, end: float) -> list[bool]:
    """Per ``slo_window_s`` window in [start, end): GEN TTFT p90 of the first tokens in
    it <= target and attainment of the requests finishing in it >= target (an empty
    part counts as met)."""
    width = auto.slo_window_s
    count = max(0, int((end - start) // width))
    ttfts: list[list[float]] = [[] for _ in range(count)]
    rates: list[list[float]] = [[] for _ in range(count)]
    for request in cluster.requests.values():
        ttft, first = request.gen_ttft, request.first_gen_token
        if ttft is not None and first is not None and start <= first < start + count * width:
            ttfts[int((first - start) // width)].append(ttft)
        rate, last = request.output_rate, request.last_token
        if rate is not None and last is not None and start <= last < start + count * width:
            rates[int((last - start) // width)].append(rate)
    met = []
    for window_ttfts, window_rates in zip(ttfts, rates, strict=True):
        ttft_ok = not window_ttfts or percentile(window_ttfts, 90) <= auto.slo_ttft_p90_s
        at_target = sum(1 for r in window_rates if r >= auto.target_output_tps)
        attained = not window_rates or at_target / len(window_rates) >= auto.attainment
        met.append(ttft_ok and attained)
    return met


def summarize_policies(
    runs: Sequence[PolicyRun],
) -> dict[str, dict[str, dict[str, float]]]:
    """{policy: {metric: {mean, ci95}}} over the seeds."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for policy in POLICIES:
        mine = [run for run in runs if run.policy == policy]
        if not mine:
            continue
        summary[policy] = {}
        for name in (*SUMMARY_METRICS, "mean_replicas", "ttft_p99", "ttft_from_arrival_p90"):
            mean, ci = mean_ci([run.metrics[name] for run in mine])
            summary[policy][name] = {"mean": mean, "ci95": ci}
    return summary
