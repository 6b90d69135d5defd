"""Prometheus metrics of a worker: every gauge and counter is a view of the engine's
latest snapshot (one ``make_stats``), plus a step-time histogram the engine feeds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from genpool_worker.engine import GenEngine

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class WorkerMetrics(Collector):
    def __init__(self, model_name: str, is_synthetic: bool) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model": model_name, "synthetic": "true" if is_synthetic else "false"}
        self.engine: GenEngine | None = None
        self.requests_total = {"ok": 0, "rejected": 0, "invalid": 0}
        self.step_seconds = Histogram(
            "genpool_step_seconds",
            "Wall time of one engine pass's model work (prefill + decode)",
            ["model", "synthetic"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(self)

    def observe_step(self, seconds: float, batch: int) -> None:
        self.step_seconds.labels(**self.labels).observe(seconds)

    def count_request(self, outcome: str) -> None:
        self.requests_total[outcome] = self.requests_total.get(outcome, 0) + 1

    def collect(self) -> Iterator[Metric]:
        names = list(self.labels)
        values = list(self.labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        requests = CounterMetricFamily(
            "genpool_requests", "HTTP completion requests by outcome", labels=[*names, "outcome"]
        )
        for outcome, count in sorted(self.requests_total.items()):
            requests.add_metric([*values, outcome], count)
        yield requests
        if self.engine is None:
            return
        snap = self.engine.snapshot
        s = snap.stats
        yield counter("genpool_tokens", "Output tokens produced", snap.tokens_total)
        yield gauge("genpool_queue_length", "Waiters in the admission queue", s.waiters)
        yield gauge("genpool_residents", "Resident requests (active + paused)", s.residents)
        yield gauge("genpool_active", "Requests in the batch", s.active)
        yield gauge("genpool_paused", "Requests paused in place", s.paused)
        yield gauge("genpool_paused_cap", "Paused cap P", s.paused_cap)
        yield gauge("genpool_resident_headroom", "Resident headroom H", s.resident_headroom)
        yield gauge("genpool_at_risk", "Keyed waiters at risk", s.at_risk)
        yield counter("genpool_completed", "Completed requests", s.completed)
        yield counter("genpool_pauses", "Pauses", s.pauses)
        victims = CounterMetricFamily("genpool_victims", "Pauses by victim kind",
                                      labels=[*names, "kind"])  # fmt: skip
        for kind, count in sorted(s.victims.items()):
            victims.add_metric([*values, kind], count)
        yield victims
        yield counter("genpool_below_target", "SLO completions below T", s.below_target)
        yield counter("genpool_slo_completed", "SLO-counted completions", s.slo_completed)
        credit = s.mode_fields.get("credit")
        if isinstance(credit, (int, float)):
            yield gauge("genpool_credit", "Sacrifice credit", float(credit))
        if s.admission_target_s is not None:
            yield gauge("genpool_admission_target_seconds", "Adaptive target X",
                        s.admission_target_s)  # fmt: skip
