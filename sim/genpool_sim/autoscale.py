"""Replicas that come and go (``genpool sim --autoscale``): the policies the pool
controller is measured with.

Every ``interval_s`` the operator's pool controller runs in the simulator's loop
(:class:`genpool_sim.pool_control.SimPool`: the stat lines, then the same
:func:`genpool_core.controller.run_round` the operator ships); the cluster adds
replicas (serving after the start-up delay) or drains them.

Policies, on the same seeds:

- ``static``: ``--workers`` fixed, pausing on (the SLO mode), no tuner: sized for
  the peak, the cost ceiling;
- ``oracle``: a replica table known in advance (``--schedule``), pausing on: each
  phase's replicas started early enough to serve from its first second;
- ``replicas-only``: the shipped law (genpool_core.scaler) with pausing off;
- ``genpool``: the shipped law with pausing and the knob tuner: the ratio to
  ``replicas-only`` is pausing's own;
- ``llm-d-slo``: llm-d's published SLO-aware law (genpool_sim.llmd_slo), pausing off.

Every scaled policy runs at the law's defaults; ``capacity_override`` pins the
learned capacity (an expert override), ``learn_days`` lets a pool serve the load
before the measured day, as a pool's learned state persists in its status.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from genpool_core.field_help import DESCRIPTION, describe
from genpool_core.knobs import start_paused_cap_fraction
from genpool_core.names import OFF_MODE, SLO_MODE, PreemptionMode
from genpool_core.quantiles import percentile
from genpool_core.scaler import ScalerSettings
from genpool_core.scaler_estimates import Estimates
from genpool_sim.cluster import Cluster, ClusterConfig
from genpool_sim.experiment import Workload, measure, simulate
from genpool_sim.llmd_slo import LlmdSloPool, LlmdSloSettings
from genpool_sim.pool_control import PoolDriver, SimPool, TuneConfig
from genpool_sim.report import mean_ci
from genpool_sim.schedule_pool import SchedulePool

LEARN_SEED_STRIDE = 1000  # day k before the measured one draws seed + k * this
POLICIES = ("static", "oracle", "replicas-only", "genpool", "llm-d-slo")
DEFAULT_POLICIES = ("static", "replicas-only", "genpool", "llm-d-slo")
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
    """The SLO, the replica bounds and the start-up the policies share; the scaled ones
    run the law at its defaults (``scaler_settings``)."""

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
    capacity_override: float | None = field(
        default=None,
        metadata={DESCRIPTION: describe(ScalerSettings, "capacity_override")},
    )
    learn_days: int = field(
        default=0,
        metadata={
            DESCRIPTION: "days of the same load (other seeds) a scaled pool serves before"
            " the measured one, starting it with what its scaler learned; 0: a new pool"
        },
    )
    schedule: tuple[tuple[float, int], ...] | None = field(
        default=None,
        metadata={
            DESCRIPTION: "the oracle policy's replica table: (phase start s, replicas) in"
            " order, from 0"
        },
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.startup_delay_s) and self.startup_delay_s >= 0):
            raise ValueError(f"start-up delay must be >= 0 s, got {self.startup_delay_s}")
        if not (math.isfinite(self.target_output_tps) and self.target_output_tps > 0):
            raise ValueError(f"T must be > 0 tok/s, got {self.target_output_tps}")
        self.scaler_settings(1)  # validates the SLO and the replica bounds

    def scaler_settings(self, max_batch: int, *, is_pausing: bool = True) -> ScalerSettings:
        """The law's settings at the shipped defaults; ``is_pausing=False``: the same law
        for a pool that does not pause."""
        return ScalerSettings(
            ttft_p90_s=self.slo_ttft_p90_s,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            max_batch=max_batch,
            attainment=self.attainment,
            is_pausing=is_pausing,
            interval_s=self.interval_s,
            startup_s=self.startup_delay_s,
            capacity_override=self.capacity_override,
        )

    def llmd_settings(self) -> LlmdSloSettings:
        return LlmdSloSettings(
            ttft_s=self.slo_ttft_p90_s,
            tpot_s=1.0 / self.target_output_tps,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            startup_delay_s=self.startup_delay_s,
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
    """One policy on one seed. ``base.workers`` is the static pool's size. With
    ``auto.learn_days``, a scaled pool first serves that many days of the same load
    (other seeds), unmeasured, and starts the measured one with what its scaler learned
    (capacity and service time: what the operator keeps in status.scaling.state)."""
    learned = None
    for day in range(1, auto.learn_days + 1):
        config, driver = policy_pool(policy, base, auto, tune, learned)
        simulate(config, workload, seed + LEARN_SEED_STRIDE * day, driver)
        learned = carried_estimates(driver)
    config, driver = policy_pool(policy, base, auto, tune, learned)
    cluster = simulate(config, workload, seed, driver)
    timeline = driver.timeline if driver is not None else []
    return PolicyRun(policy, seed, policy_metrics(cluster, workload, auto), timeline)


def carried_estimates(driver: PoolDriver | None) -> Estimates | None:
    """What a scaled pool's next day starts from: its learned capacity and service time
    (the forecast and the round's history are today's)."""
    if not isinstance(driver, SimPool):
        return None
    estimates = driver.state.scaler.estimates
    return Estimates(service_s=estimates.service_s, capacity=estimates.capacity)


def policy_pool(
    policy: str, base: ClusterConfig, auto: AutoscaleConfig, tune: TuneConfig,
    learned: Estimates | None = None,
) -> tuple[ClusterConfig, PoolDriver | None]:  # fmt: skip
    """The workers' settings and the replica controller of a policy (module doc)."""
    # the pausing policies start their knobs as a GenPool in the SLO mode does
    fraction = start_paused_cap_fraction(PreemptionMode.TARGET_OUTPUT_TPS)
    slo = replace(base, mode=SLO_MODE, target_output_tps=auto.target_output_tps,
                  paused_cap_fraction=fraction)  # fmt: skip
    off = replace(base, mode=OFF_MODE, workers=auto.min_replicas)
    interval, delay = auto.interval_s, auto.startup_delay_s
    match policy:
        case "static":  # observed, never scaled
            return slo, SimPool(interval)
        case "oracle":
            if auto.schedule is None:
                raise ValueError("the oracle policy needs a schedule (AutoscaleConfig.schedule)")
            table = SchedulePool(auto.schedule, delay)
            return replace(slo, workers=table.start_replicas), table
        case "replicas-only":
            settings = auto.scaler_settings(base.max_batch, is_pausing=False)
            return off, SimPool(interval, None, settings, delay, learned)
        case "genpool":
            bounds = tune.bounds
            config = replace(slo, workers=auto.min_replicas,
                             max_resident_headroom=bounds.max_resident_headroom)  # fmt: skip
            tuner = TuneConfig(bounds, interval, tune.settings)
            settings = auto.scaler_settings(base.max_batch)
            return config, SimPool(interval, tuner, settings, delay, learned)
        case "llm-d-slo":
            return off, LlmdSloPool(auto.llmd_settings())
    raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")


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
        "output_rate_p50": base["output_rate_p50"],
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
