"""Runs of the simulated pool and their per-run metrics (one seed, one mode).

``run_seed`` runs every requested mode on the same seed: ``off`` first, because
``T = auto`` is the off run's median output rate / 1.10 (the seed's definition).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from genpool_worker.sim.cluster import Cluster, ClusterConfig
from genpool_worker.sim.records import SimRequest
from genpool_worker.sim.workload import LengthSampler, TraceRequest

AUTO_T_DIVISOR = 1.10


@dataclass(frozen=True)
class Workload:
    """Closed loop (``concurrency`` clients) or open loop (``arrivals`` replayed)."""

    lengths: Sequence[TraceRequest]
    concurrency: int | None = None
    arrivals: Sequence[TraceRequest] | None = None
    duration_s: float = 600.0
    warmup_s: float = 60.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.arrivals is None):
            raise ValueError("a workload is either closed-loop (concurrency) or open-loop")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("need 0 <= warmup < duration")


@dataclass
class RunResult:
    mode: str
    seed: int
    target_output_tps: float | None
    metrics: dict[str, float]
    stat_lines: list[tuple[int, str]] = field(default_factory=list)
    records: list[SimRequest] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def simulate(config: ClusterConfig, workload: Workload, seed: int) -> Cluster:
    rng = random.Random(seed)
    cluster = Cluster(config)
    ids = itertools.count()
    if workload.arrivals is not None:
        for request in workload.arrivals:
            cluster.submit(
                SimRequest(
                    f"r{next(ids)}",
                    request.arrival_s,
                    request.prompt_tokens,
                    request.output_tokens,
                )
            )
        cluster.run()
        return cluster
    sampler = LengthSampler(workload.lengths, rng)

    def send(client: int, at: float) -> None:
        if at < workload.duration_s:
            prompt, output = sampler.sample()
            cluster.submit(SimRequest(f"c{client}-{next(ids)}", at, prompt, output, client))

    cluster.on_done = lambda request, now: send(request.client or 0, now)
    assert workload.concurrency is not None
    for client in range(workload.concurrency):  # staggered over the first second
        send(client, rng.random())
    cluster.run()
    return cluster


def measure(
    cluster: Cluster, workload: Workload, target_output_tps: float | None
) -> tuple[dict[str, float], list[SimRequest]]:
    start, end = workload.warmup_s, workload.duration_s
    if workload.arrivals is not None:
        end = max((r.arrival for r in cluster.requests.values()), default=0.0)
    done = [r for r in cluster.requests.values() if r.is_done and start <= r.arrival < end]
    gen = [r for r in done if r.ttft is not None]
    ttft = [r.ttft for r in gen if r.ttft is not None]
    wait = [r.admission_wait for r in gen if r.admission_wait is not None]
    e2e = [r.e2e for r in done if r.e2e is not None]
    tpot = [r.tpot for r in gen if r.tpot is not None]
    rates = [r.output_rate for r in gen if r.output_rate is not None]
    gen_tokens = sum(n for t, n in cluster.tokens_by_time if start <= t < end)
    first_tokens = sum(
        1
        for r in cluster.requests.values()
        if r.first_token_time is not None and start <= r.first_token_time < end
    )
    metrics: dict[str, float] = {"requests": float(len(done))}
    for name, values in (("ttft", ttft), ("admission_wait", wait), ("e2e", e2e)):
        for q in (50, 90, 99):
            metrics[f"{name}_p{q}"] = percentile(values, q)
    metrics["ttft_mean"] = sum(ttft) / len(ttft) if ttft else math.nan
    metrics["e2e_mean"] = sum(e2e) / len(e2e) if e2e else math.nan
    metrics["ttft_ctx_p90"] = percentile([r.ttft_ctx or 0.0 for r in done], 90)
    metrics["tpot_mean"] = sum(tpot) / len(tpot) if tpot else math.nan
    metrics["tpot_p90"] = percentile(tpot, 90)
    metrics["output_rate_p50"] = percentile(rates, 50)
    if target_output_tps is not None and rates:
        metrics["below_target"] = sum(1 for r in rates if r < target_output_tps) / len(rates)
    metrics["output_tokens_per_s"] = (gen_tokens + first_tokens) / (end - start)
    metrics["pauses_per_request"] = sum(r.num_pauses for r in gen) / max(1, len(gen))
    metrics["evictions_per_request"] = sum(r.num_evictions for r in gen) / max(1, len(gen))
    return metrics, done


def run_seed(
    base: ClusterConfig,
    workload: Workload,
    modes: Sequence[str],
    seed: int,
    target_output_tps: float | None = None,
    keep_records: bool = False,
) -> list[RunResult]:
    """All modes on one seed. ``target_output_tps=None`` means auto (needs ``off``)."""
    ordered = sorted(modes, key=lambda m: m != "off")
    results: list[RunResult] = []
    target = target_output_tps
    for mode in ordered:
        if mode == "target_output_tps" and target is None:
            raise ValueError("T = auto needs the off mode in the same run")
        config = replace(base, mode=mode, target_output_tps=target)
        cluster = simulate(config, workload, seed)
        metrics, done = measure(cluster, workload, target)
        if mode == "off" and target is None:
            target = metrics["output_rate_p50"] / AUTO_T_DIVISOR
            metrics["below_target"] = sum(
                1 for r in done if (rate := r.output_rate) is not None and rate < target
            ) / max(1, sum(1 for r in done if r.output_rate is not None))
        results.append(
            RunResult(mode, seed, target, metrics, cluster.stat_lines, done if keep_records else [])
        )
    for result in results:
        result.target_output_tps = target
    return results
