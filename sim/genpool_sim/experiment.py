"""Runs of the simulated pool and their per-run metrics (one seed, one mode).

``run_seed`` runs every requested mode on the same seed: ``off`` first, because
``T = auto`` is the off run's median output rate / 1.10 (the seed's definition).
With request classes (``Workload.classes``) every run labels each request with its
class, but only the extra :data:`PER_REQUEST_MODE` run hands the classes' D_i and T_i
to the workers; the others see one pool T, the baseline it is compared against.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from genpool_core.field_help import DESCRIPTION
from genpool_core.names import OFF_MODE, SLO_MODE
from genpool_core.quantiles import percentile
from genpool_sim.cluster import Cluster, ClusterConfig
from genpool_sim.conversations import ConversationSettings, draw_conversations, run_conversations
from genpool_sim.phases import Phase, run_closed_loop
from genpool_sim.pool_control import PoolDriver, SimPool, TuneConfig
from genpool_sim.prefix_metrics import prefix_metrics
from genpool_sim.records import SimRequest
from genpool_sim.slo_classes import ClassPicker, SloClass, class_metrics
from genpool_sim.workload import (
    LengthSampler,
    RatePhase,
    TraceRequest,
    phased_gamma_arrivals,
)

AUTO_T_DIVISOR = 1.10
# target_output_tps with each request carrying its class's own floor (and D_i)
PER_REQUEST_MODE = "per_request_tps"


@dataclass(frozen=True)
class Workload:
    """Closed loop (``concurrency`` clients, or ``phases`` of client counts; the phases
    set the duration) or open loop (``arrivals`` replayed, or Gamma arrivals with
    coefficient of variation ``cv`` at the ``rate_phases``' rates, drawn per seed; the
    phases set the duration), or ``conversations`` (open across them, closed within)."""

    lengths: Sequence[TraceRequest] = field(
        metadata={DESCRIPTION: "the trace's (prompt, output) length pairs requests draw from"}
    )
    concurrency: int | None = field(
        default=None,
        metadata={
            DESCRIPTION: "closed loop: number of clients, each sending its next request"
            " the moment its last one ends"
        },
    )
    arrivals: Sequence[TraceRequest] | None = field(
        default=None, metadata={DESCRIPTION: "open loop: these requests at their own times"}
    )
    duration_s: float = field(
        default=600.0,
        metadata={
            DESCRIPTION: "simulated seconds in which requests arrive, then clients stop"
            " and the pool drains; phases, when given, set it"
        },
    )
    warmup_s: float = field(
        default=60.0,
        metadata={DESCRIPTION: "first simulated seconds, whose arrivals the metrics exclude"},
    )
    phases: Sequence[Phase] | None = field(
        default=None,
        metadata={
            DESCRIPTION: "closed loop whose number of clients changes: (seconds, clients)"
            " per phase, in order; they set the duration"
        },
    )
    rate_phases: Sequence[RatePhase] | None = field(
        default=None,
        metadata={
            DESCRIPTION: "open loop whose Gamma arrival rate changes: (seconds, requests/s)"
            " per phase, in order; they set the duration"
        },
    )
    cv: float = field(
        default=1.0,
        metadata={
            DESCRIPTION: "coefficient of variation of the open loop's Gamma inter-arrival"
            " times, unitless; 1: Poisson"
        },
    )
    conversations: ConversationSettings | None = field(
        default=None,
        metadata={DESCRIPTION: "multi-turn conversations started at a rate, drawn per seed"},
    )
    classes: Sequence[SloClass] = field(
        default=(),
        metadata={
            DESCRIPTION: "request classes, each with its share of the requests and its own"
            " SLOs: output-rate floor T_i (tokens/s) and GEN admission target D_i (seconds)"
        },
    )

    def __post_init__(self) -> None:
        kinds = (self.concurrency, self.arrivals, self.phases, self.rate_phases,
                 self.conversations)  # fmt: skip
        if sum(kind is not None for kind in kinds) != 1:
            raise ValueError("a workload is closed-loop (concurrency or phases) or open-loop")
        timed = self.phases or self.rate_phases
        if timed is not None:
            object.__setattr__(self, "duration_s", sum(p.duration_s for p in timed))
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
    tuning: list[dict[str, object]] = field(default_factory=list)


def simulate(
    config: ClusterConfig,
    workload: Workload,
    seed: int,
    pool: PoolDriver | None = None,
    carries_slo: bool = False,
) -> Cluster:
    """One run; with classes, requests carry their class's SLO only if ``carries_slo``."""
    rng = random.Random(seed)
    cluster = Cluster(config)
    if cluster.kv_gauge is not None:  # KV use over the measured window
        cluster.kv_gauge.start, cluster.kv_gauge.end = workload.warmup_s, workload.duration_s
    ids = itertools.count()
    picker = ClassPicker(workload.classes, seed) if workload.classes else None

    def submit(request: SimRequest) -> None:
        if picker is not None:
            picker.assign(request, carries_slo=carries_slo)
        cluster.submit(request)

    if pool is not None:  # the pool controller's rounds
        pool.attach(cluster)
        every(cluster, pool.interval_s, workload.duration_s, pool.tick, order=1)
    if workload.conversations is not None:  # each seed draws its own conversations
        drawn = draw_conversations(workload.conversations, workload.cv, workload.duration_s,
                                   workload.lengths, rng)  # fmt: skip
        run_conversations(cluster, drawn, workload.duration_s, submit)
        return cluster
    arrivals = workload.arrivals
    if workload.rate_phases is not None:  # each seed draws its own arrivals and lengths
        arrivals = phased_gamma_arrivals(workload.rate_phases, workload.cv, workload.lengths, rng)
    if arrivals is not None:
        for request in arrivals:
            submit(
                SimRequest(
                    f"r{next(ids)}",
                    request.arrival_s,
                    request.prompt_tokens,
                    request.output_tokens,
                )
            )
        cluster.run()
        return cluster
    phases = workload.phases or [Phase(workload.duration_s, workload.concurrency or 0)]
    sampler = LengthSampler(workload.lengths, rng)
    run_closed_loop(cluster, phases, workload.duration_s, sampler, rng, lambda: next(ids), submit)
    return cluster


def every(
    cluster: Cluster,
    interval_s: float,
    duration_s: float,
    tick: Callable[[Cluster, float], None],
    order: int,
) -> None:
    """``tick`` at interval_s, 2 interval_s, ... up to the duration, via the event heap."""
    for k in range(1, int(duration_s // interval_s) + 1):
        cluster.at(k * interval_s, lambda now: tick(cluster, now), order)


def measure(
    cluster: Cluster, workload: Workload, target_output_tps: float | None
) -> tuple[dict[str, float], list[SimRequest]]:
    start, end = workload.warmup_s, workload.duration_s
    if workload.concurrency is None and workload.phases is None:  # open loop
        end = max((r.arrival for r in cluster.requests.values()), default=0.0)
    done = [r for r in cluster.requests.values() if r.is_done and start <= r.arrival < end]
    gen = [r for r in done if r.ttft is not None]
    ttft = [r.ttft for r in gen if r.ttft is not None]
    wait = [r.admission_wait for r in gen if r.admission_wait is not None]
    e2e = [r.e2e for r in done if r.e2e is not None]
    tpot = [r.tpot for r in gen if r.tpot is not None]
    rates = [r.output_rate for r in gen if r.output_rate is not None]
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
    metrics["output_tokens_per_s"] = _output_tokens(cluster, start, end) / (end - start)
    metrics["pauses_per_request"] = sum(r.num_pauses for r in gen) / max(1, len(gen))
    metrics["evictions_per_request"] = sum(r.num_evictions for r in gen) / max(1, len(gen))
    gauge, num_blocks = cluster.kv_gauge, cluster.config.kv_blocks
    if gauge is not None and num_blocks is not None:
        metrics |= gauge.metrics(num_blocks, cluster.replica_seconds(gauge.start, gauge.end))
    if workload.conversations is not None:
        metrics |= prefix_metrics(done, cluster.requests.values(), cluster.config.kv_block_size)
    return metrics, done


def _output_tokens(cluster: Cluster, start: float, end: float) -> int:
    """Tokens produced in ``[start, end)``: the GEN passes', and the context stage's first
    tokens (a colocated worker's first tokens are in its passes)."""
    tokens = sum(n for t, n in cluster.tokens_by_time if start <= t < end)
    if not cluster.config.colocated:
        firsts = [r.first_token_time for r in cluster.requests.values()]
        tokens += sum(1 for t in firsts if t is not None and start <= t < end)
    return tokens


def run_seed(
    base: ClusterConfig,
    workload: Workload,
    modes: Sequence[str],
    seed: int,
    target_output_tps: float | None = None,
    keep_records: bool = False,
    tune: TuneConfig | None = None,
) -> list[RunResult]:
    """All modes on one seed. ``target_output_tps=None`` means auto (needs ``off``);
    with classes and the SLO mode, also :data:`PER_REQUEST_MODE`."""
    ordered = sorted(modes, key=lambda m: m != OFF_MODE)
    runs = [(mode, mode, False) for mode in ordered]
    if workload.classes and SLO_MODE in modes:
        runs.append((PER_REQUEST_MODE, SLO_MODE, True))
    results: list[RunResult] = []
    finished: list[list[SimRequest]] = []
    target = target_output_tps
    for label, mode, carries_slo in runs:
        if mode == SLO_MODE and target is None:
            raise ValueError("T = auto needs the off mode in the same run")
        config = replace(base, mode=mode, target_output_tps=target)
        pool = None
        if tune is not None and mode == SLO_MODE:
            config = replace(config, max_resident_headroom=tune.bounds.max_resident_headroom)
            pool = SimPool(tune.interval_s, tune)
        cluster = simulate(config, workload, seed, pool, carries_slo=carries_slo)
        metrics, done = measure(cluster, workload, target)
        if mode == OFF_MODE and target is None:
            target = metrics["output_rate_p50"] / AUTO_T_DIVISOR
            metrics["below_target"] = sum(
                1 for r in done if (rate := r.output_rate) is not None and rate < target
            ) / max(1, sum(1 for r in done if r.output_rate is not None))
        records = done if keep_records else []
        decisions = pool.records if pool is not None else []
        results.append(
            RunResult(label, seed, target, metrics, cluster.stat_lines, records, decisions)
        )
        finished.append(done)
    for result, done in zip(results, finished, strict=True):
        result.target_output_tps = target
        if workload.classes:  # against the final T: a class without a floor uses it
            result.metrics |= class_metrics(done, workload.classes, target)
    return results
