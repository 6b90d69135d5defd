"""The replica scaler's law (genpool_core.scaler): each term, consolidation, bounds,
windows, and the TTFT histogram it reads. The window signals and the learned estimates
have their own file (test_scaler_estimates.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from genpool_core import ttft_histogram
from genpool_core.aggregate import PoolStats
from genpool_core.scaler import (
    DOWN,
    UP_BACKLOG,
    UP_FORECAST,
    UP_TAIL,
    ScalerSettings,
    ScalerState,
    scale,
)
from genpool_core.scaler_estimates import Estimates

B = 16
SETTINGS = ScalerSettings(
    ttft_p90_s=1.0, min_replicas=2, max_replicas=20, max_batch=B, attainment=0.8,
    is_pausing=True, interval_s=30.0, startup_s=60.0,
)  # fmt: skip
PLANNER = replace(SETTINGS, is_pausing=False)
SERVICE = 8.0  # batch position-seconds per request
# a pool that has served before: its rate, service time and capacity known, stable
KNOWN = Estimates(level=10.0, service_s=SERVICE, capacity=0.8, ready=10, calm_rounds=5)


def hist(seconds: float, n: int) -> tuple[int, ...]:
    counts = [0] * ttft_histogram.NUM_BUCKETS
    counts[ttft_histogram.bucket_of(seconds)] = n
    return tuple(counts)


def pool(rate: float = 10.0, workers: int = 10, **overrides: object) -> PoolStats:
    """``workers`` replicas, one 30 s window each, ``rate`` requests/s arriving and
    finishing, each taking SERVICE position-seconds, the SLO comfortably met (GEN TTFT
    p90 0.2 s, 5 % below T)."""
    completed = round(rate * 30)
    base = PoolStats(
        workers_reporting=workers, mode="target_output_tps", paused=0, paused_cap=6 * workers,
        resident_headroom=6 * workers, waiters=0, at_risk=0, completed_window=completed,
        pauses_window=0, laxity_resumes=0, below_target_window=0.05,
        slo_completed_window=completed, arrivals_window=completed, steps_window=3000,
        batch_mean=8.0, ttft_hist=hist(0.2, completed), pause_budget=3 * workers,
        batch_seconds=completed * SERVICE,
    )  # fmt: skip
    return replace(base, **overrides)  # type: ignore[arg-type]


def once(replicas: int, stats: PoolStats | None, settings: ScalerSettings = SETTINGS,
         state: ScalerState | None = None, num_ready: int | None = None, now: float = 300.0,
         ):  # type: ignore[no-untyped-def]  # fmt: skip
    state = state or ScalerState(estimates=replace(KNOWN, ready=replicas))
    ready = replicas if num_ready is None else num_ready
    return scale(replicas, ready, stats, settings, state, now)


def test_histogram_quantile_lands_in_the_right_bucket_and_sums_over_workers() -> None:
    values = [0.01 * k for k in range(1, 101)]  # 0.01 .. 1.0 s
    counts = [0] * ttft_histogram.NUM_BUCKETS
    for v in values:
        counts[ttft_histogram.bucket_of(v)] += 1
    p90 = ttft_histogram.quantile(counts, 0.9)
    assert p90 is not None and 0.9 / 1.25 <= p90 <= 0.9 * 1.25
    assert ttft_histogram.quantile([0] * ttft_histogram.NUM_BUCKETS, 0.9) is None
    both = ttft_histogram.summed([counts, counts])
    assert sum(both) == 200 and ttft_histogram.quantile(both, 0.9) == pytest.approx(p90)
    text = ttft_histogram.format_sparse(counts)
    assert ttft_histogram.parse_sparse(text) == tuple(counts)
    assert ttft_histogram.parse_sparse("-") == (0,) * ttft_histogram.NUM_BUCKETS
    for bad in ("x", "99:1", "3:-1", "3"):
        with pytest.raises(ValueError):
            ttft_histogram.parse_sparse(bad)


def test_the_forecast_term_is_demand_in_positions_over_the_learned_capacity() -> None:
    # 15 req/s x 8 s = 120 positions; a replica holds about 0.8 x 16 = 12.8: 10 replicas
    decision = once(
        8,
        pool(rate=15.0, workers=8),
        state=ScalerState(estimates=replace(KNOWN, level=15.0, ready=8)),
    )
    assert (decision.replicas, decision.reason) == (10, UP_FORECAST)
    inputs = decision.inputs
    assert inputs is not None and inputs.forecast == pytest.approx(15.0)
    assert inputs.occupancy == pytest.approx(120 / 128)  # a met window near capacity...
    step = SETTINGS.capacity_gain * SETTINGS.capacity_miss_rate
    assert inputs.capacity == pytest.approx(0.8 * (1 + step))  # ...raises it a step
    assert inputs.forecast_replicas == math.ceil(15.0 * SERVICE / (inputs.capacity * B))
    assert inputs.per_replica_rate == pytest.approx(inputs.capacity * B / SERVICE)


def test_a_rising_trend_buys_ahead_by_the_horizon() -> None:
    rising = ScalerState(estimates=replace(KNOWN, level=10.0, trend=1.0, ready=7))
    flat = once(7, pool(workers=7), state=ScalerState(estimates=replace(KNOWN, ready=7)))
    ahead = once(7, pool(workers=7), state=rising)
    assert flat.replicas == 7
    assert flat.inputs is not None and ahead.inputs is not None
    assert ahead.inputs.forecast > flat.inputs.forecast + 1.0
    assert ahead.replicas > flat.replicas


def test_waiters_the_pause_budget_can_admit_are_no_backlog() -> None:
    queued = pool(workers=7, waiters=25, pause_budget=30)
    absorbed = once(7, queued)
    assert absorbed.inputs is not None and absorbed.inputs.backlog == 0
    assert absorbed.inputs.backlog_replicas == 0 and absorbed.replicas == 7
    planner = once(7, replace(queued, pause_budget=None), PLANNER)
    assert planner.reason == UP_BACKLOG
    assert planner.inputs is not None and planner.inputs.backlog == 25
    assert planner.inputs.backlog_replicas >= 1 and planner.replicas > absorbed.replicas


def test_a_backlog_buys_replicas_that_go_as_soon_as_it_is_gone() -> None:
    state = ScalerState(estimates=replace(KNOWN, ready=8))
    queued = once(8, pool(rate=10.0, workers=8, waiters=400, pause_budget=0), state=state)
    assert queued.reason == UP_BACKLOG and queued.inputs is not None
    assert queued.inputs.backlog_replicas >= 2
    bought = queued.replicas
    # the queue drained: the next rounds consolidate to what the rate needs, the down
    # window (which keeps what the demand needed) does not hold the backlog's replicas
    state, now = queued.state, 300.0
    for _ in range(12):
        now += 30.0
        decision = scale(bought, bought, pool(workers=bought), SETTINGS, state, now)
        state, bought = decision.state, decision.replicas
    assert bought == math.ceil(10.0 * SERVICE / (0.8 * B))


def test_the_tail_scales_up_in_proportion_at_most_doubling_and_only_on_a_settled_pool() -> None:
    missed = pool(ttft_hist=hist(2.0, 300))  # p90 2 s against 1 s: tail 2 (clamped)
    settled = ScalerState(estimates=replace(KNOWN, ready=10, tail=2.0))
    decision = once(10, missed, state=settled)
    assert decision.reason == UP_TAIL and decision.replicas == 18  # 10 + max_step 8
    assert decision.inputs is not None and decision.inputs.tail_replicas == 20
    mild = once(
        10,
        pool(ttft_hist=hist(0.9, 300)),
        state=ScalerState(estimates=replace(KNOWN, ready=10, tail=0.9)),
    )
    tail = mild.inputs.tail if mild.inputs is not None else None
    assert tail is not None and 0.8 < tail < 1.2
    assert mild.inputs is not None
    assert mild.inputs.tail_replicas == 10 + math.ceil(10 * (tail / 0.8 - 1))
    # replicas just became ready: their effect is not in the tail yet
    fresh = once(10, missed, state=ScalerState(estimates=replace(KNOWN, ready=6, tail=2.0)))
    assert fresh.inputs is not None and fresh.inputs.tail_replicas == 0


def test_consolidation_waits_for_a_whole_window_and_goes_to_its_highest_need() -> None:
    settings = replace(SETTINGS, down_window_s=120.0)
    state = ScalerState(estimates=replace(KNOWN, level=3.0, ready=10))
    now, reasons, replicas = 0.0, [], 10
    for rate in (3.0, 3.0, 4.0, 3.0, 3.0, 3.0, 3.0):
        now += 30.0
        stats = pool(rate=rate, workers=replicas)
        decision = scale(replicas, replicas, stats, settings, state, now)
        state, replicas = decision.state, decision.replicas
        reasons.append(decision.reason)
    # the window is not covered yet (the 4 req/s round's trend holds one round itself:
    # the forecast climbs past the level)
    assert set(reasons[:4]) <= {"hold-down-window", "hold"} and "hold" in reasons[:4]
    assert DOWN in reasons[4:]
    # the highest need over the window: the 4 req/s round's (the level 3.5 req/s, with
    # the down margin 3 replicas), not the 3 req/s rounds' 2
    assert replicas == 3


def test_no_consolidation_while_the_tail_is_high_or_waiters_queue() -> None:
    warm = ScalerState(recommendations=tuple((t, 2) for t in range(0, 300, 30)),
                       estimates=replace(KNOWN, level=2.0, ready=10, tail=0.6))  # fmt: skip
    tailing = once(10, pool(rate=2.0, ttft_hist=hist(0.6, 60)), state=warm, now=300.0)
    assert tailing.replicas == 10 and tailing.reason == "hold"
    queued = once(
        10,
        pool(rate=2.0, waiters=50, pause_budget=0),
        PLANNER,
        state=replace(warm, estimates=replace(warm.estimates, tail=0.1)),
        now=300.0,
    )
    assert queued.replicas >= 10


def test_bounds_are_obeyed_at_once_and_missing_stats_keep_the_estimates() -> None:
    assert once(1, pool()).replicas == 2 and once(1, pool()).reason == "clamp-to-bounds"
    assert once(30, pool()).replicas == 20
    missing = once(10, None, state=ScalerState(((270.0, 9),), KNOWN))
    assert (missing.replicas, missing.reason) == (10, "stats-missing")
    assert missing.state.recommendations == () and missing.state.estimates == KNOWN


def test_an_up_is_capped_by_max_step_and_max_replicas() -> None:
    surge = pool(rate=100.0, workers=4)
    state = ScalerState(estimates=replace(KNOWN, level=100.0, ready=4))
    assert once(4, surge, state=state).replicas == 4 + SETTINGS.max_step
    capped = once(4, surge, replace(SETTINGS, max_replicas=6), state=state)
    assert capped.replicas == 6


def test_the_up_window_steps_only_as_far_as_every_recent_recommendation_asked() -> None:
    settings = replace(SETTINGS, up_window_s=60.0)
    state = ScalerState(recommendations=((240.0, 11), (270.0, 12)),
                        estimates=replace(KNOWN, level=15.0, ready=8))  # fmt: skip
    decision = once(8, pool(rate=15.0, workers=8), settings, state=state)
    assert decision.replicas == 10  # what it asks, as the window's recommendations did
    low = ScalerState(recommendations=((240.0, 9), (270.0, 12)), estimates=state.estimates)
    assert once(8, pool(rate=15.0, workers=8), settings, state=low).replicas == 9
    short = ScalerState(recommendations=((270.0, 12),), estimates=state.estimates)
    held = once(8, pool(rate=15.0, workers=8), settings, state=short)
    assert (held.replicas, held.reason) == (8, "hold-up-window")


def test_windows_tolerate_rounds_that_land_late_or_early() -> None:
    settings = replace(SETTINGS, down_window_s=120.0)
    # rounds 31 s apart: four of them span 93 s, a 120 s window is covered within 15 s
    recs = ((180.0, 2), (211.0, 2), (242.0, 2), (273.0, 2))
    state = ScalerState(recs, replace(KNOWN, level=2.0, ready=10))
    assert once(10, pool(rate=2.0), settings, state=state, now=304.0).reason == DOWN


def test_state_round_trips_and_garbage_restarts_its_parts() -> None:
    state = ScalerState(((10.0, 3), (40.0, 4)), replace(KNOWN, trend=-0.5, tail=0.3))
    assert ScalerState.from_status(state.to_status()) == state
    assert ScalerState.from_status(None) == ScalerState()
    odd = {"recommendations": [[1, 2], "x", [True, 3], [5, -1]],
           "estimates": {"level": "fast", "capacity": 7.0, "serviceSeconds": 4.0}}  # fmt: skip
    parsed = ScalerState.from_status(odd)
    assert parsed.recommendations == ((1.0, 2),)
    assert parsed.estimates == Estimates(service_s=4.0)


@pytest.mark.parametrize(
    "overrides",
    [{"ttft_p90_s": 0.0}, {"min_replicas": 5, "max_replicas": 4}, {"attainment": 1.0},
     {"max_step": 0}, {"capacity_override": 1.5}, {"capacity_prior": 0.0},
     {"tail_down": 0.9, "tail_up": 0.8}, {"drain_s": 0.0}, {"interval_s": math.inf},
     {"forecast_trend_damping": 1.5}],
)  # fmt: skip
def test_bad_settings_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        replace(SETTINGS, **overrides)


def test_an_event_quotes_the_numbers_the_decision_read() -> None:
    decision = once(
        8,
        pool(rate=15.0, workers=8),
        state=ScalerState(estimates=replace(KNOWN, level=15.0, ready=8)),
    )
    assert decision.inputs is not None
    text = decision.inputs.text()
    rate = decision.inputs.capacity * B / SERVICE
    assert "forecast 15.00 req/s" in text and f"capacity {rate:.2f} req/s per replica" in text
    assert "pause budget 24" in text and "backlog 0" in text
    status = decision.inputs.to_status()
    assert status["forecastReplicas"] == 10
    assert status["capacity"] == pytest.approx(decision.inputs.capacity, abs=1e-4)
