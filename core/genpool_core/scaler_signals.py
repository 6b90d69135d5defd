"""What one pool window says to the replica scaler (docs/design.md#replica-scaler).

Read from the aggregated stat lines (:class:`genpool_core.aggregate.PoolStats`), pure:

- the **arrival rate**: requests that reached the pool per second (demand, not
  throughput: it counts the requests a queue holds back too);
- the **occupancy**: the share of each replica's batch positions in use, over time
  (batch size x pass seconds, ``batch_s`` on the line, over B x the window);
- the **service time**: batch position-seconds per completed request, which pausing
  does not change (a paused request is out of the batch), so demand in positions is
  arrival rate x service time with pausing or without;
- the **tail**: the SLO-normalised tail, max(GEN TTFT p90 / its target, below-T share
  / its budget 1 - attainment): 1 is the SLO's edge, above it the window missed;
- the **backlog**: waiters that pausing cannot admit (all of them without pausing).
"""

from __future__ import annotations

from dataclasses import dataclass

from genpool_core.aggregate import PoolStats
from genpool_core.scaler_settings import ScalerSettings

TAIL_CLAMP = 2.0  # a window far over the SLO counts as twice over (llm-d's clamp)


@dataclass(frozen=True, slots=True)
class WindowSignals:
    arrival_rate: float  # requests/s into the pool over the window
    occupancy: float | None  # mean share of a replica's batch positions in use
    service_s: float | None  # batch position-seconds per completion; None: too few
    tail: float | None  # the window's SLO-normalised tail; None: too few samples
    backlog: int  # waiters pausing cannot admit now
    pause_budget: int | None  # at-risk waiters pausing could still admit; None: off
    workers: int  # replicas that reported


def read_window(stats: PoolStats, settings: ScalerSettings) -> WindowSignals:
    """The signals of one pool window (a round's new stat windows)."""
    pod_windows = max(1, stats.num_windows)
    per_pod = pod_windows / max(1, stats.workers_reporting)  # windows each pod added
    window_s = settings.interval_s * per_pod
    busy = stats.batch_seconds
    occupancy = None
    if busy is not None:
        occupancy = busy / (pod_windows * settings.interval_s * settings.max_batch)
    service = None
    if busy is not None and stats.completed_window >= settings.min_samples:
        service = busy / stats.completed_window
    budget = stats.pause_budget if settings.is_pausing else None
    return WindowSignals(
        arrival_rate=stats.arrivals_window / window_s,
        occupancy=occupancy,
        service_s=service,
        tail=tail_signal(stats, settings),
        backlog=max(0, stats.waiters - (budget or 0)),
        pause_budget=budget,
        workers=stats.workers_reporting,
    )


def tail_signal(stats: PoolStats, settings: ScalerSettings) -> float | None:
    """max(p90 / target, below-T / (1 - attainment)) over the parts with enough samples,
    clamped at :data:`TAIL_CLAMP`; ``None`` when neither part has them."""
    parts = []
    p90 = stats.ttft_p90
    if p90 is not None and stats.num_first_tokens >= settings.min_samples:
        parts.append(p90 / settings.ttft_p90_s)
    below = stats.below_target_window
    has_floor = settings.attainment is not None and below is not None
    if has_floor and stats.slo_completed_window >= settings.min_samples:
        assert settings.attainment is not None and below is not None
        parts.append(below / (1.0 - settings.attainment))
    return min(TAIL_CLAMP, max(parts)) if parts else None
