"""Prometheus metrics of a worker: every gauge and counter is a view of the engine's
latest snapshot (one ``make_stats``), plus a step-time histogram the engine feeds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from genpool_core.stats import SloModeStats
from genpool_worker.api import ARRIVAL_SOURCES

if TYPE_CHECKING:
    from genpool_core.stats import SchedulerStats
    from genpool_worker.engine import GenEngine
    from genpool_worker.kv_events import KVEventPublisher
    from genpool_worker.speculative import SpecDecodeCounts

# The model-server protocol (Gateway API Inference Extension endpoint pickers, llm-d,
# KEDA): vLLM's names, so unmodified consumers read a GenPool worker. The picker of GIE
# v1.2.0 reads the KV gauge under vLLM's older name, so it is exported under both.
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
# vLLM v1's prefix-cache counters (exposed with _total), in prompt tokens
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
KV_CACHE_USAGE_PERC_OLD = "vllm:gpu_cache_usage_perc"
# vLLM v1's speculative-decoding counters (exposed with _total)
SPEC_DECODE_NUM_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_DECODE_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # GIE reads block_size and num_gpu_blocks
MODEL_NAME_LABEL = "model_name"  # vLLM's label on these series

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class WorkerMetrics(Collector):
    def __init__(self, model_name: str, is_synthetic: bool) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model": model_name, "synthetic": "true" if is_synthetic else "false"}
        self.engine: GenEngine | None = None
        self.kv_block_size = 0  # tokens per KV block, fixed for the worker's life
        self.kv_events: KVEventPublisher | None = None  # --kv-events-config's publisher
        self.requests_total = {"ok": 0, "rejected": 0, "invalid": 0}
        self.step_seconds = Histogram(
            "genpool_step_seconds",
            "Wall time of one engine pass's model work (prefill + decode)",
            ["model", "synthetic"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        # Measured at this worker: from the HTTP request's receipt to its first streamed
        # text (admission wait + the worker's own prefill), and decode time per token.
        self.ttft_seconds = Histogram(
            "genpool_ttft_seconds",
            "Receipt of a completion request to its first output text at this worker",
            ["model", "synthetic"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.tpot_seconds = Histogram(
            "genpool_tpot_seconds",
            "Mean time per output token after the first, per completed request",
            ["model", "synthetic"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        # Which source keyed each request (docs/design.md#keyed-by-default), and whether
        # its stamp was older than the bound (clamped): a gateway that stamps shows as
        # "header", a client forging old stamps as clamped ones.
        self.arrival_keys = Counter(
            "genpool_arrival_keys",
            "Requests by the source of their arrival key (header, body, receipt, unkeyed)"
            " and whether the stamp was clamped to --max-arrival-age-s",
            ["source", "clamped"],
            registry=self.registry,
        )
        for source in ARRIVAL_SOURCES:  # every series from the start (0), so rates work
            self.arrival_keys.labels(source, "false")
        self.registry.register(self)

    def attach(self, engine: GenEngine) -> None:
        """Serve gauges from ``engine``'s snapshots from now on."""
        self.engine = engine
        self.kv_block_size = engine.model_info.kv_block_size

    def observe_request(self, ttft_s: float | None, tpot_s: float | None) -> None:
        if ttft_s is not None:
            self.ttft_seconds.labels(**self.labels).observe(ttft_s)
        if tpot_s is not None:
            self.tpot_seconds.labels(**self.labels).observe(tpot_s)

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
        if self.kv_events is not None:
            yield from self.kv_event_counters(self.kv_events)
        if self.engine is None:
            return
        snap = self.engine.snapshot
        s = snap.stats
        yield from self.model_server_gauges(s)
        if snap.spec_decode is not None:
            yield from self.spec_decode_counters(snap.spec_decode)
        yield counter("genpool_tokens", "Output tokens produced", snap.tokens_total)
        yield gauge("genpool_kv_blocks_cached", "KV-cache blocks holding a cached prefix",
                    s.kv_blocks_cached)  # fmt: skip
        yield gauge("genpool_queue_length", "Waiters in the admission queue", s.waiters)
        yield gauge("genpool_residents", "Resident requests (active + paused)", s.residents)
        yield gauge("genpool_active", "Requests in the batch", s.active)
        yield gauge("genpool_paused", "Requests paused in place", s.paused)
        yield gauge("genpool_paused_cap", "Paused cap P", s.paused_cap)
        yield gauge("genpool_resident_headroom", "Resident headroom H", s.resident_headroom)
        yield gauge("genpool_at_risk", "Keyed waiters at risk", s.at_risk)
        yield gauge("genpool_kv_blocks", "KV-cache blocks of this worker", s.kv_blocks)
        yield gauge("genpool_kv_blocks_used", "KV-cache blocks held by residents",
                    s.kv_blocks_used)  # fmt: skip
        yield gauge("genpool_kv_blocks_paused", "KV-cache blocks held by paused requests",
                    s.kv_blocks_paused)  # fmt: skip
        yield counter("genpool_completed", "Completed requests", s.completed)
        yield counter("genpool_pauses", "Pauses", s.pauses)
        victims = CounterMetricFamily("genpool_victims", "Pauses by victim kind",
                                      labels=[*names, "kind"])  # fmt: skip
        for kind, count in sorted(s.victims.items()):
            victims.add_metric([*values, kind], count)
        yield victims
        yield counter(
            "genpool_below_target",
            "completions below their output-rate floor (their own T_i, else the pool T)",
            s.below_target,
        )
        yield counter("genpool_slo_completed", "SLO-counted completions", s.slo_completed)
        if isinstance(s.mode_stats, SloModeStats):
            yield gauge("genpool_credit", "Sacrifice credit", float(s.mode_stats.credit))
        if s.admission_target_s is not None:
            yield gauge("genpool_admission_target_seconds", "Adaptive target X",
                        s.admission_target_s)  # fmt: skip

    def spec_decode_counters(self, counts: SpecDecodeCounts) -> Iterator[Metric]:
        """vLLM's speculative-decoding counters: drafts (requests verified per step),
        drafted and accepted tokens, and accepted tokens by draft position."""
        labels = {MODEL_NAME_LABEL: self.labels["model"]}
        for name, doc, count in (
            (SPEC_DECODE_NUM_DRAFTS, "Requests that verified drafts, once per step",
             counts.num_drafts),
            (SPEC_DECODE_NUM_DRAFT_TOKENS, "Drafted tokens verified", counts.num_draft_tokens),
            (SPEC_DECODE_NUM_ACCEPTED_TOKENS, "Drafted tokens accepted",
             counts.num_accepted_tokens),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=list(labels))
            family.add_metric(list(labels.values()), float(count))
            yield family
        per_position = CounterMetricFamily(
            SPEC_DECODE_ACCEPTED_PER_POS, "Drafted tokens accepted, by draft position",
            labels=[*labels, "position"],
        )  # fmt: skip
        for position, count in enumerate(counts.accepted_per_position):
            per_position.add_metric([*labels.values(), str(position)], float(count))
        yield per_position

    def kv_event_counters(self, publisher: KVEventPublisher) -> Iterator[Metric]:
        """The KV event publisher's batches by outcome, and the events it skipped."""
        names, values = list(self.labels), list(self.labels.values())
        counts = publisher.counts
        batches = CounterMetricFamily(
            "genpool_kv_event_batches",
            "KV event batches: sent, dropped (the send queue was full), failed (the socket"
            " refused them)",
            labels=[*names, "outcome"],
        )
        for outcome, count in (("sent", counts.sent), ("dropped", counts.dropped),
                               ("failed", counts.failed)):  # fmt: skip
            batches.add_metric([*values, outcome], count)
        yield batches
        skipped = CounterMetricFamily(
            "genpool_kv_events_skipped", "KV events whose tokens were gone", labels=names
        )
        skipped.add_metric(values, counts.skipped)
        yield skipped

    def model_server_gauges(self, s: SchedulerStats) -> Iterator[Metric]:
        """Queued = waiting for admission. Running = residents: a paused resident keeps
        its KV blocks, so it is running to a router. KV usage = KV blocks held (by
        residents, paused ones included) over the worker's blocks, in [0, 1]."""
        labels = {MODEL_NAME_LABEL: self.labels["model"]}
        usage = s.kv_blocks_used / s.kv_blocks if s.kv_blocks > 0 else 0.0
        for name, doc, value in (
            (NUM_REQUESTS_WAITING, "Requests waiting for admission", s.waiters),
            (NUM_REQUESTS_RUNNING, "Resident requests (in the batch or paused)", s.residents),
            (KV_CACHE_USAGE_PERC, "Fraction of KV-cache blocks held by residents", usage),
            (KV_CACHE_USAGE_PERC_OLD, f"{KV_CACHE_USAGE_PERC} under vLLM's older name", usage),
        ):
            family = GaugeMetricFamily(name, doc, labels=list(labels))
            family.add_metric(list(labels.values()), float(value))
            yield family
        for name, doc, count in (
            (PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache",
             s.prefix_cache_queries),
            (PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache", s.prefix_cache_hits),
        ):  # fmt: skip
            counted = CounterMetricFamily(name, doc, labels=list(labels))
            counted.add_metric(list(labels.values()), float(count))
            yield counted
        # vLLM's info metric: a constant 1 whose labels carry the cache geometry.
        info = GaugeMetricFamily(
            CACHE_CONFIG_INFO, "KV-cache configuration", labels=["block_size", "num_gpu_blocks"]
        )
        info.add_metric([str(self.kv_block_size), str(s.kv_blocks)], 1.0)
        yield info


class RequestTimer:
    """TTFT and TPOT of one completion, fed by the server as events stream out."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._start = time.monotonic()
        self._first: float | None = None

    def text(self) -> None:
        if self._first is None:
            self._first = time.monotonic()

    def done(self, completion_tokens: int) -> None:
        if self._first is None:
            return
        ttft = self._first - self._start
        decode = time.monotonic() - self._first
        tpot = decode / (completion_tokens - 1) if completion_tokens > 1 else None
        self._metrics.observe_request(ttft, tpot)
