"""One snapshot of a scheduler's gauges and cumulative counters (``make_stats``).

The stat line, the HTTP ``/stats`` body and the Prometheus metrics are all views of
this one object, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SloModeStats:
    """The ``target_output_tps`` mode's gauges."""

    credit: float  # the sacrifice credit bucket
    paused_below_target: int  # paused residents that are below target or sacrificed


@dataclass(frozen=True, slots=True)
class TpotModeStats:
    """The ``tpot_budget`` mode's gauges."""

    budget: float  # the TPOT budget b (seconds per token)
    window_s: float  # the window controller's current window
    inflation: float | None = None  # last period's mean TPOT inflation; None before one


ModeStats = SloModeStats | TpotModeStats | None  # None: a mode without gauges of its own


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    t: float
    mode: str
    target_output_tps: float | None
    residents: int
    active: int
    paused: int
    paused_cap: int
    resident_headroom: int
    waiters: int
    at_risk: int
    admission_target_s: float | None
    # cumulative since start
    completed: int = 0
    aborted: int = 0
    pauses: int = 0
    victims: Mapping[str, int] = field(default_factory=dict)
    laxity_sum: float = 0.0
    laxity_resumes: int = 0
    forced_resumes: int = 0
    slo_completed: int = 0
    below_target: int = 0
    # load and latency counters the replica scaler reads (cumulative since start)
    arrivals: int = 0  # requests queued at this worker
    steps: int = 0  # decode passes with a non-empty batch
    batch_sum: int = 0  # batch sizes summed over those passes
    batch_seconds: float = 0.0  # batch size x pass seconds, summed (position-seconds)
    ttft_counts: tuple[int, ...] = ()  # GEN TTFT histogram (genpool_core.ttft_histogram)
    # KV blocks (genpool_core.kv_blocks): the worker's, held, held by paused residents;
    # all 0 without a KV budget
    kv_blocks: int = 0
    kv_blocks_used: int = 0
    kv_blocks_paused: int = 0
    # prefix caching (genpool_core.kv_account): blocks holding a cached prefix (gauge);
    # prompt tokens looked up and found (cumulative); all 0 with caching off
    kv_blocks_cached: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # at-risk waiters pausing could admit now (free paused slots, pausable residents);
    # None with preemption off
    pause_budget: int | None = None
    # speculative decoding (genpool_core.speculation): drafted tokens verified, and those
    # of them emitted (cumulative); 0 with it off
    drafted: int = 0
    accepted: int = 0
    mode_stats: ModeStats = None  # the mode's own gauges (the policy's ``mode_stats``)
