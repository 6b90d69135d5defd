"""The P/D series of a worker's /metrics (docs/pd.md#metrics), defined once here."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SIDES = ("export", "import")
# "untrusted": a header or handle named an endpoint the pool does not know (not contacted)
FALLBACK_REASONS = ("foreign", "pull_failed", "prefill_failed", "role", "ranks", "untrusted")
TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A P/D request's time to first token, in its parts (the decode worker observes them).
TTFT_PARTS = ("prefill_queue", "prefill", "handoff", "transfer", "gen_wait")


class PDMetrics:
    def __init__(self, registry: CollectorRegistry, num_held: Callable[[], int]) -> None:
        self.transfers = Counter(
            "genpool_kv_transfers", "KV transfers by side and how they ended",
            ["side", "outcome"], registry=registry,
        )  # fmt: skip
        self.transfer_bytes = Counter(
            "genpool_kv_transfer_bytes", "KV bytes moved by P/D pulls", ["side"], registry=registry
        )
        self.transfer_seconds = Histogram(
            "genpool_kv_transfer_seconds", "Wall time of one KV pull, as the decode side saw it",
            buckets=TRANSFER_BUCKETS, registry=registry,
        )  # fmt: skip
        self.fallbacks = Counter(
            "genpool_kv_transfer_fallbacks", "Requests prefilled locally instead of pulled",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.ttft_parts = Histogram(
            "genpool_pd_ttft_part_seconds", "A pulled request's time to first token, by part",
            ["part"], buckets=(*TRANSFER_BUCKETS, 10.0, 30.0), registry=registry,
        )  # fmt: skip
        held = Gauge("genpool_kv_exports_held", "Exports whose KV blocks are held",
                     registry=registry)  # fmt: skip
        held.set_function(lambda: float(num_held()))
        for side in SIDES:  # every series exists from the start (0), so rates work
            self.transfer_bytes.labels(side)
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(reason)

    def count_export(self, outcome: str) -> None:
        self.transfers.labels("export", outcome).inc()

    def fallback(self, reason: str) -> None:
        self.fallbacks.labels(reason).inc()
