"""What the replica scaler reads from a window (genpool_core.scaler_signals) and what it
learns over windows (genpool_core.scaler_estimates): forecast, service time, capacity."""

from __future__ import annotations

from dataclasses import replace

import pytest

from genpool_core import ttft_histogram
from genpool_core.aggregate import PoolStats
from genpool_core.scaler_estimates import MIN_CAPACITY, Estimates, learned_capacity
from genpool_core.scaler_settings import ScalerSettings
from genpool_core.scaler_signals import TAIL_CLAMP, WindowSignals, read_window, tail_signal

B = 16
SETTINGS = ScalerSettings(ttft_p90_s=1.0, min_replicas=1, max_replicas=20, max_batch=B,
                          attainment=0.8, is_pausing=True)  # fmt: skip


def hist(seconds: float, n: int) -> tuple[int, ...]:
    counts = [0] * ttft_histogram.NUM_BUCKETS
    counts[ttft_histogram.bucket_of(seconds)] = n
    return tuple(counts)


def stats(**overrides: object) -> PoolStats:
    """Four replicas, one 30 s window each: 120 arrivals (4 req/s), 120 completions of
    6 position-seconds each (720 of 4 x 30 x 16 = 1920: occupancy 0.375)."""
    base = PoolStats(
        workers_reporting=4, mode="target_output_tps", paused=2, paused_cap=24,
        resident_headroom=24, waiters=10, at_risk=0, completed_window=120, pauses_window=3,
        laxity_resumes=0, below_target_window=0.04, slo_completed_window=100,
        arrivals_window=120, steps_window=4000, batch_mean=6.0, ttft_hist=hist(0.25, 120),
        batch_seconds=720.0, pause_budget=4,
    )  # fmt: skip
    return replace(base, **overrides)  # type: ignore[arg-type]


def signals(**overrides: object) -> WindowSignals:
    base = WindowSignals(arrival_rate=4.0, occupancy=0.7, service_s=6.0, tail=0.3,
                         backlog=0, pause_budget=4, workers=4)  # fmt: skip
    return replace(base, **overrides)  # type: ignore[arg-type]


def test_a_window_reads_rate_occupancy_service_tail_and_backlog() -> None:
    read = read_window(stats(), SETTINGS)
    assert read.arrival_rate == pytest.approx(4.0)
    assert read.occupancy == pytest.approx(0.375)
    assert read.service_s == pytest.approx(6.0)
    assert read.backlog == 10 - 4 and read.pause_budget == 4  # the budget admits four
    planner = read_window(stats(), replace(SETTINGS, is_pausing=False))
    assert planner.backlog == 10 and planner.pause_budget is None


def test_two_windows_from_one_pod_are_one_pods_two_intervals() -> None:
    # a late read: each of the 4 pods added two windows (8 in all) in one round
    read = read_window(stats(windows_counted=8, arrivals_window=240, batch_seconds=1440.0),
                       SETTINGS)  # fmt: skip
    assert read.arrival_rate == pytest.approx(4.0)
    assert read.occupancy == pytest.approx(0.375)


def test_too_few_completions_give_no_service_time() -> None:
    assert read_window(stats(completed_window=19), SETTINGS).service_s is None
    assert read_window(stats(batch_seconds=None), SETTINGS).occupancy is None


def test_the_tail_is_the_worse_of_ttft_and_the_rate_floor_normalised_and_clamped() -> None:
    assert tail_signal(stats(), SETTINGS) == pytest.approx(
        max(ttft_histogram.quantile(hist(0.25, 120), 0.9) or 0.0, 0.04 / 0.2)
    )
    floor = tail_signal(stats(below_target_window=0.3), SETTINGS)
    assert floor == pytest.approx(0.3 / 0.2)  # 30 % below T against a 20 % budget
    assert tail_signal(stats(ttft_hist=hist(50.0, 120)), SETTINGS) == TAIL_CLAMP
    # each part needs its samples: 19 first tokens and 19 counted completions say nothing
    quiet = stats(ttft_hist=hist(5.0, 19), slo_completed_window=19)
    assert tail_signal(quiet, SETTINGS) is None
    # the rate floor only where the SLO has one (attainment None: TTFT alone)
    ttft_only = replace(SETTINGS, attainment=None)
    assert tail_signal(stats(below_target_window=0.9), ttft_only) == pytest.approx(
        ttft_histogram.quantile(hist(0.25, 120), 0.9)
    )


def test_the_forecast_follows_a_step_and_a_ramp_with_a_damped_trend() -> None:
    estimates = Estimates()
    for rate in (4.0, 4.0, 4.0):
        estimates = estimates.updated(signals(arrival_rate=rate), SETTINGS, num_ready=4,
                                      replicas=4)  # fmt: skip
    assert estimates.level == pytest.approx(4.0) and estimates.trend == pytest.approx(0.0)
    assert estimates.forecast(SETTINGS) == pytest.approx(4.0)
    ramp = estimates
    for rate in (5.0, 6.0, 7.0, 8.0):
        ramp = ramp.updated(signals(arrival_rate=rate), SETTINGS, num_ready=4, replicas=4)
    # a ramp of 1 req/s a window: the forecast one horizon (3 windows) on leads the level
    assert ramp.forecast(SETTINGS) > ramp.level + 1.0  # type: ignore[operator]
    falling = ramp.updated(signals(arrival_rate=2.0), SETTINGS, num_ready=4, replicas=4)
    assert falling.forecast(SETTINGS) == falling.level  # never below the level


def test_the_service_time_is_smoothed_and_kept_without_completions() -> None:
    first = Estimates().updated(signals(service_s=6.0), SETTINGS, num_ready=4, replicas=4)
    assert first.service_s == 6.0
    second = first.updated(signals(service_s=10.0), SETTINGS, num_ready=4, replicas=4)
    assert second.service_s == pytest.approx(0.7 * 6.0 + 0.3 * 10.0)
    kept = second.updated(signals(service_s=None), SETTINGS, num_ready=4, replicas=4)
    assert kept.service_s == second.service_s


def test_capacity_rises_on_met_loaded_windows_and_falls_on_misses_at_or_below_it() -> None:
    gain, rate = SETTINGS.capacity_gain, SETTINGS.capacity_miss_rate
    up = learned_capacity(0.8, signals(occupancy=0.7, tail=0.4), SETTINGS)
    assert up == pytest.approx(0.8 * (1 + gain * rate))
    down = learned_capacity(0.8, signals(occupancy=0.75, tail=1.3), SETTINGS)
    assert down == pytest.approx(0.8 * (1 - gain * (1 - rate)))
    # what says nothing about capacity: a quiet met window, a miss above the estimate
    # (the pool was over it)
    assert learned_capacity(0.8, signals(occupancy=0.3, tail=0.1), SETTINGS) == 0.8
    assert learned_capacity(0.8, signals(occupancy=0.95, tail=1.5), SETTINGS) == 0.8
    assert learned_capacity(0.8, signals(tail=None), SETTINGS) == 0.8
    assert learned_capacity(MIN_CAPACITY, signals(occupancy=0.1, tail=2.0),
                            SETTINGS) == MIN_CAPACITY  # fmt: skip
    assert learned_capacity(1.0, signals(occupancy=0.99, tail=0.1), SETTINGS) == 1.0


def test_the_estimate_settles_where_loaded_windows_miss_at_the_miss_rate() -> None:
    """A pool whose windows miss whenever occupancy passes 0.6: the estimate climbs to it
    and stays within a step of it (the quantile it tracks)."""
    capacity = 0.9
    history = []
    for _ in range(400):
        occupancy = capacity * 0.95  # the law fills replicas near the estimate
        tail = 1.2 if occupancy > 0.6 else 0.5
        capacity = learned_capacity(capacity, signals(occupancy=occupancy, tail=tail), SETTINGS)
        history.append(capacity)
    assert min(history[-100:]) > 0.5 and max(history[-100:]) < 0.75


def test_nothing_is_learned_while_the_pool_changes_surges_or_drains_a_queue() -> None:
    settled = Estimates(level=4.0, service_s=6.0, capacity=0.8, ready=4, calm_rounds=3)
    missed = signals(occupancy=0.7, tail=1.5)
    assert settled.is_calm(missed, 4, 4, SETTINGS)
    assert not settled.is_calm(missed, 3, 4, SETTINGS)  # a replica is still starting
    assert not replace(settled, ready=3).is_calm(missed, 4, 4, SETTINGS)  # one just came
    assert not replace(settled, calm_rounds=1).is_calm(missed, 4, 4, SETTINGS)  # lingering
    assert not settled.is_calm(replace(missed, backlog=30), 4, 4, SETTINGS)  # a queue formed
    surge = replace(missed, arrival_rate=9.0)  # far past the 4 req/s forecast: lag
    assert not settled.is_calm(surge, 4, 4, SETTINGS)
    assert settled.updated(missed, SETTINGS, num_ready=3, replicas=4).capacity == 0.8
    assert settled.updated(surge, SETTINGS, num_ready=4, replicas=4).capacity == 0.8
    assert settled.updated(missed, SETTINGS, num_ready=4, replicas=4).capacity < 0.8
    # a disturbance restarts the count of calm windows; a calm one adds to it
    assert settled.updated(surge, SETTINGS, num_ready=4, replicas=4).calm_rounds == 0
    assert settled.updated(missed, SETTINGS, num_ready=4, replicas=4).calm_rounds == 4


def test_an_override_pins_the_capacity() -> None:
    pinned = replace(SETTINGS, capacity_override=0.55)
    learned = Estimates(capacity=0.9).updated(signals(tail=2.0), pinned, num_ready=4, replicas=4)
    assert learned.capacity_in_force(pinned) == 0.55
    assert Estimates().capacity_in_force(SETTINGS) == SETTINGS.capacity_prior


def test_estimates_round_trip_and_garbage_restarts_each_part() -> None:
    estimates = Estimates(4.2, -0.3, 6.5, 0.77, 0.4, 5, 2)
    assert Estimates.from_status(estimates.to_status()) == estimates
    assert Estimates.from_status("x") == Estimates()
    odd = {"level": -1, "trend": "up", "serviceSeconds": 0, "capacity": 0.05, "tail": True,
           "ready": 2.5, "calmRounds": -1}  # fmt: skip
    assert Estimates.from_status(odd) == Estimates()


def test_the_forecast_follows_a_step_alike_at_any_interval() -> None:
    """Gains are per 30 s: six 5 s windows move the level as far as one 30 s window."""
    at_30 = Estimates(level=4.0).updated(signals(arrival_rate=12.0), SETTINGS, num_ready=4,
                                         replicas=4)  # fmt: skip
    fine = replace(SETTINGS, interval_s=5.0)
    at_5 = Estimates(level=4.0, trend=0.0)
    for _ in range(6):
        at_5 = at_5.updated(signals(arrival_rate=12.0), fine, num_ready=4, replicas=4)
    assert SETTINGS.per_window(0.5) == pytest.approx(0.5)
    assert fine.per_window(0.5) == pytest.approx(1 - 0.5 ** (1 / 6))
    assert at_30.level is not None and at_5.level is not None
    assert at_5.level == pytest.approx(at_30.level, rel=0.15)  # Holt's trend differs a little
