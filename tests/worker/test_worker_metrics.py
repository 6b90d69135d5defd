"""The worker's Prometheus view of one snapshot: the mode's own gauges (typed mode stats)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from prometheus_client import generate_latest

from genpool_core.names import OFF_MODE, SLO_MODE, TPOT_MODE
from genpool_core.stats import SchedulerStats, SloModeStats, TpotModeStats
from genpool_worker.metrics import WorkerMetrics

STATS = SchedulerStats(
    t=30.0, mode=SLO_MODE, target_output_tps=18.5, residents=4, active=3, paused=1,
    paused_cap=2, resident_headroom=2, waiters=0, at_risk=0, admission_target_s=None,
    mode_stats=SloModeStats(credit=3.5, paused_below_target=1),
)  # fmt: skip


def scrape(stats: SchedulerStats) -> str:
    metrics = WorkerMetrics("test", is_synthetic=True)
    metrics.engine = SimpleNamespace(  # type: ignore[assignment]
        snapshot=SimpleNamespace(
            stats=stats, tokens_total=0, shared_prefill_tokens_total=0, spec_decode=None
        )
    )
    metrics.max_batch_size = 4
    return generate_latest(metrics.registry).decode()


def credit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("genpool_credit{")]


def test_slo_mode_exports_its_credit() -> None:
    (line,) = credit_lines(scrape(STATS))
    assert line.endswith(" 3.5")


def test_other_modes_export_no_credit() -> None:
    tpot = dataclasses.replace(STATS, mode=TPOT_MODE, mode_stats=TpotModeStats(0.1, 0.25))
    off = dataclasses.replace(STATS, mode=OFF_MODE, mode_stats=None)
    assert credit_lines(scrape(tpot)) == credit_lines(scrape(off)) == []
