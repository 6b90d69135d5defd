"""The operator's Prometheus metrics, served on ``/metrics`` (``--metrics-port``).

What every stats round decided, by pool and reason, so a dashboard or an HPA sees the
same decisions as ``status`` and the Events: the tuner's and the scaler's decisions
(holds included), the desired replicas, the SLO as measured, the round's duration and
the stat lines that could not be read.
"""

from __future__ import annotations

import contextlib
import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from genpool_operator.round_plan import RoundPlan

log = logging.getLogger("genpool.operator.metrics")
POOL = ("namespace", "pool")
# The decision series written per pool, so a deleted pool's can be dropped (the client
# library removes series by their full label values only).
_decision_labels: set[tuple[str, str, str, str, str]] = set()

DECISIONS = Counter(
    "genpool_operator_decisions",
    "Tuner (kind=knobs) and scaler (kind=replicas) decisions, holds included.",
    [*POOL, "kind", "reason", "advisory"],
)
DESIRED_REPLICAS = Gauge(
    "genpool_operator_desired_replicas", "Replicas the scaler wants (autoscaling).", POOL
)
SLO_TTFT_P90 = Gauge(
    "genpool_operator_slo_ttft_p90_seconds", "GEN TTFT p90 over the last stats window.", POOL
)
SLO_ATTAINMENT = Gauge(
    "genpool_operator_slo_attainment",
    "Share of the last window's finished requests at or above T.",
    POOL,
)
ROUND_SECONDS = Histogram(
    "genpool_operator_round_duration_seconds",
    "Wall time of one stats round: scrape, plan, push, status.",
    POOL,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
SCRAPE_ERRORS = Counter(
    "genpool_operator_scrape_errors",
    "Ready worker pods whose stat line could not be read in a round.",
    POOL,
)


def serve(host: str, port: int) -> bool:
    """Start ``/metrics`` on a background thread; False (and an error logged) if the
    port cannot be bound: the operator keeps running without metrics."""
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        log.error("cannot serve /metrics on %s:%d: %s", host, port, exc)
        return False
    log.info("serving /metrics on %s:%d", host, port)
    return True


def record_round(
    namespace: str,
    pool: str,
    plan: RoundPlan,
    *,
    is_autoscaling: bool,
    num_scrape_errors: int,
    seconds: float,
) -> None:
    labels = (namespace, pool)
    decision = plan.decision
    advisory = "true" if decision.is_advisory else "false"
    if decision.tuning is not None:
        _count_decision((*labels, "knobs", decision.tuning.reason, advisory))
    if decision.scaling is not None:
        _count_decision((*labels, "replicas", decision.scaling.reason, advisory))
    if is_autoscaling:
        DESIRED_REPLICAS.labels(*labels).set(decision.desired)
    else:  # autoscaling off: no desired count to report, not the last one frozen
        _remove(DESIRED_REPLICAS, labels)
    if decision.slo.ttft_p90_s is not None:
        SLO_TTFT_P90.labels(*labels).set(decision.slo.ttft_p90_s)
    if decision.slo.attainment is not None:
        SLO_ATTAINMENT.labels(*labels).set(decision.slo.attainment)
    if num_scrape_errors:
        SCRAPE_ERRORS.labels(*labels).inc(num_scrape_errors)
    ROUND_SECONDS.labels(*labels).observe(seconds)


def _count_decision(labels: tuple[str, str, str, str, str]) -> None:
    _decision_labels.add(labels)
    DECISIONS.labels(*labels).inc()


def _remove(metric: Counter | Gauge | Histogram, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never written for this pool
        metric.remove(*labels)


def forget_pool(namespace: str, pool: str) -> None:
    """Drop a deleted pool's series, so dashboards and HPAs stop seeing its last values."""
    labels = (namespace, pool)
    for metric in (DESIRED_REPLICAS, SLO_TTFT_P90, SLO_ATTAINMENT, ROUND_SECONDS, SCRAPE_ERRORS):
        _remove(metric, labels)
    for decision in [d for d in _decision_labels if d[:2] == labels]:
        _decision_labels.discard(decision)
        _remove(DECISIONS, decision)
