"""The replica scaler: each rule, stabilisation, bounds, and the TTFT histogram it reads."""

from __future__ import annotations

from dataclasses import replace

import pytest

from genpool_core import ttft_histogram
from genpool_core.aggregate import PoolStats
from genpool_core.scaler import ScalerSettings, ScalerState, recommend, scale

A = 16
SETTINGS = ScalerSettings(
    ttft_p90_s=1.0, min_replicas=2, max_replicas=20, max_batch=A, attainment=0.8, cap_max=8
)
PLANNER = replace(SETTINGS, attainment=None, cap_max=None)
LOADED = ScalerState(loaded_at=0.0)  # the round before (t = 0) asked for more on load too


def hist(seconds: float, n: int) -> tuple[int, ...]:
    counts = [0] * ttft_histogram.NUM_BUCKETS
    counts[ttft_histogram.bucket_of(seconds)] = n
    return tuple(counts)


def pool(**overrides: object) -> PoolStats:
    """Ten workers at half occupancy, the SLO comfortably met."""
    base = PoolStats(
        workers_reporting=10, mode="target_output_tps", paused=0, paused_cap=60,
        resident_headroom=60, waiters=0, at_risk=0, completed_window=100, pauses_window=0,
        laxity_resumes=0, below_target_window=0.05,
        arrivals_window=100, steps_window=3000, batch_mean=8.0, ttft_hist=hist(0.2, 100),
    )  # fmt: skip
    return replace(base, **overrides)  # type: ignore[arg-type]


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


def test_histogram_window_is_current_minus_previous() -> None:
    assert ttft_histogram.window_counts((3, 5, 7), (1, 5)) == (2, 0, 7)
    assert ttft_histogram.bucket_of(-1.0) == 0 and ttft_histogram.bucket_of(1e9) == 46


def test_met_slo_at_half_load_holds_or_shrinks_to_the_load() -> None:
    assert recommend(10, pool(), SETTINGS) == (6, "down-utilisation-low")  # 80 / (0.85 * 16)
    assert recommend(6, pool(), SETTINGS) == (6, "hold")


def test_arrivals_outrunning_completions_with_a_queue_scale_up_in_proportion() -> None:
    stats = pool(arrivals_window=150, completed_window=100, waiters=30)
    # 10 completions per replica per window; 150 arrivals plus 30 waiting need 18
    assert recommend(10, stats, SETTINGS) == (18, "up-arrivals-outrun-completions")
    # without a queue it is a transient: no action from this rule
    assert recommend(10, replace(stats, waiters=0), SETTINGS)[1] != (
        "up-arrivals-outrun-completions"
    )


def test_ttft_miss_waits_for_the_knobs_while_they_can_help() -> None:
    # P = 4 per worker, under the bound 8, with budget left
    missed = pool(ttft_hist=hist(1.5, 100), paused_cap=40)
    assert recommend(10, missed, SETTINGS) == (10, "hold-knobs-first")
    at_bound = replace(missed, paused_cap=80)
    assert recommend(10, at_bound, SETTINGS) == (13, "up-ttft-miss")
    budget_spent = replace(missed, below_target_window=0.25)
    assert recommend(10, budget_spent, SETTINGS) == (13, "up-ttft-miss")
    severe = replace(missed, ttft_hist=hist(3.0, 100))
    assert recommend(10, severe, SETTINGS) == (13, "up-ttft-miss")
    assert recommend(10, missed, PLANNER) == (13, "up-ttft-miss")  # no knob lever


def test_attainment_miss_scales_up_only_when_the_misses_come_from_queueing() -> None:
    laxity = pool(below_target_window=0.3, victims={"laxity": 40})
    assert recommend(10, laxity, SETTINGS) == (13, "up-attainment-miss-queueing")
    implicated = pool(below_target_window=0.3, victims={"below_target": 30, "laxity": 10})
    assert recommend(10, implicated, SETTINGS) == (10, "hold-knobs-first")
    # the planner does not look at attainment at all
    assert recommend(10, laxity, PLANNER) == (6, "down-utilisation-low")


def test_too_few_samples_are_not_a_miss() -> None:
    noisy = pool(ttft_hist=hist(5.0, 5), completed_window=5, below_target_window=0.9)
    assert recommend(10, noisy, SETTINGS)[1] == "down-utilisation-low"


def test_up_is_immediate_but_capped_and_waits_for_starting_replicas() -> None:
    missed = pool(ttft_hist=hist(5.0, 100))
    decision = scale(10, 10, missed, SETTINGS, ScalerState(), now=30.0)
    assert (decision.replicas, decision.reason) == (13, "up-ttft-miss")
    big = pool(arrivals_window=400, completed_window=100, waiters=100)
    assert scale(10, 10, big, SETTINGS, LOADED, 30.0).replicas == 18  # max_step 8
    assert scale(19, 19, big, SETTINGS, LOADED, 30.0).replicas == 20  # max replicas
    starting = scale(13, 10, missed, SETTINGS, ScalerState(), 60.0)
    assert (starting.replicas, starting.reason) == (13, "hold-starting")
    # the throughput count is absolute (from the 10 serving): it tops up while others start
    behind = pool(arrivals_window=150, completed_window=100, waiters=30)
    assert scale(13, 10, behind, SETTINGS, ScalerState(loaded_at=30.0), 60.0).replicas == 18
    assert scale(18, 10, behind, SETTINGS, ScalerState(loaded_at=30.0), 60.0).replicas == 18


def test_down_waits_for_a_full_window_of_agreeing_recommendations() -> None:
    state, t = ScalerState(), 0.0
    reasons = []
    while t <= 300.0:
        decision = scale(10, 10, pool(), SETTINGS, state, t)
        state, t = decision.state, t + 30.0
        reasons.append(decision.reason)
        if decision.replicas != 10:
            break
    assert reasons[:-1] == ["hold-down-window"] * 10 and t == 330.0
    assert decision.replicas == 6 and decision.reason == "down-utilisation-low"
    # one up recommendation inside the window blocks the down step
    missed = pool(ttft_hist=hist(5.0, 100))
    state = scale(10, 10, missed, SETTINGS, ScalerState(), 0.0).state
    for t in (30.0, 60.0, 300.0):
        decision = scale(10, 10, pool(), SETTINGS, state, t)
        state = decision.state
    assert decision.replicas == 10
    assert scale(10, 10, pool(), SETTINGS, state, 330.0).replicas == 6


def test_bounds_are_obeyed_at_once_and_missing_stats_freeze() -> None:
    assert scale(25, 25, pool(), SETTINGS, ScalerState(), 0.0).reason == "clamp-to-bounds"
    assert scale(1, 1, pool(), SETTINGS, ScalerState(), 0.0).replicas == 2
    frozen = scale(10, 10, None, SETTINGS, ScalerState(((0.0, 5),)), 30.0)
    assert (frozen.replicas, frozen.reason, frozen.state) == (10, "stats-missing", ScalerState())
    low = replace(SETTINGS, min_replicas=8, down_window_s=0.0)
    assert scale(10, 10, pool(), low, ScalerState(), 0.0).replicas == 8


def test_state_round_trips_and_garbage_restarts_it() -> None:
    state = ScalerState(((30.0, 5), (60.0, 6)), loaded_at=60.0)
    assert ScalerState.from_status(state.to_status()) == state
    assert ScalerState.from_status({"loadedAt": "x"}) == ScalerState()
    assert ScalerState.from_status(None) == ScalerState()
    assert ScalerState.from_status({"recommendations": "x"}) == ScalerState()
    garbage = {"recommendations": [[1, 2], ["a", 3], [1], [True, 2], [float("nan"), 1]]}
    assert ScalerState.from_status(garbage) == ScalerState(((1.0, 2),))


@pytest.mark.parametrize(
    "overrides",
    [
        {"ttft_p90_s": 0.0},
        {"min_replicas": 0},
        {"min_replicas": 5, "max_replicas": 4},
        {"attainment": 1.0},
        {"max_step": 0},
        {"down_window_s": -1.0},
        {"up_window_s": -1.0},
        {"interval_s": 0.0},
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        replace(SETTINGS, **overrides)  # type: ignore[arg-type]


def test_the_knob_lever_lets_the_pool_run_closer_to_full() -> None:
    stats = pool(batch_mean=10.0)  # 100 requests in the batches
    assert recommend(10, stats, SETTINGS) == (7, "down-utilisation-low")  # 100 / (0.95 * 16)
    assert recommend(10, stats, PLANNER) == (8, "down-utilisation-low")  # 100 / (0.85 * 16)


def test_load_above_the_ceiling_scales_up_before_a_queue_forms_even_while_starting() -> None:
    busy = pool(batch_mean=15.5)  # 155 in the batches, no miss yet, no queue
    assert recommend(10, busy, SETTINGS) == (11, "up-utilisation-high")  # 155 / 15.2
    assert recommend(10, busy, PLANNER) == (12, "up-utilisation-high")  # 155 / 13.6
    assert scale(11, 10, busy, PLANNER, LOADED, 30.0).replicas == 12


def test_a_single_burst_while_the_slo_holds_buys_no_replica_but_two_in_a_row_do() -> None:
    burst = pool(arrivals_window=150, completed_window=100, waiters=30)  # outrun, SLO met
    first = scale(10, 10, burst, SETTINGS, ScalerState(), 30.0)
    assert (first.replicas, first.reason) == (10, "hold-single-burst")
    second = scale(10, 10, burst, SETTINGS, first.state, 60.0)
    assert (second.replicas, second.reason) == (18, "up-arrivals-outrun-completions")
    # a quiet window between two bursts: each is single again
    quiet = scale(10, 10, pool(), SETTINGS, first.state, 60.0)
    assert scale(10, 10, burst, SETTINGS, quiet.state, 90.0).reason == "hold-single-burst"
    # the SLO needs it: a burst that misses TTFT steps at once
    missing = replace(burst, ttft_hist=hist(5.0, 100))
    assert scale(10, 10, missing, SETTINGS, ScalerState(), 30.0).replicas == 18


def test_no_flap_after_a_scale_down_hands_waiters_back() -> None:
    """The drained replica's waiters arrive at the others in the next window: arrivals
    outrun completions for one window, the SLO holds, so the pool does not scale back."""
    state, t, replicas = ScalerState(), 0.0, 10
    while replicas == 10:  # a long quiet spell: down after the window
        decision = scale(replicas, replicas, pool(), SETTINGS, state, t)
        state, replicas, t = decision.state, decision.replicas, t + 30.0
    assert replicas == 6
    handed_back = pool(workers_reporting=6, arrivals_window=160, completed_window=100,
                       waiters=12, batch_mean=8.0)  # fmt: skip
    after = scale(replicas, replicas, handed_back, SETTINGS, state, t)
    assert (after.replicas, after.reason) == (6, "hold-single-burst")
    settled = scale(6, 6, pool(workers_reporting=6), SETTINGS, after.state, t + 30.0)
    assert settled.replicas == 6


def test_windows_tolerate_rounds_that_land_late_or_early() -> None:
    """Rounds every 30 s give or take 10 s: the 300 s down window is covered after ten
    intervals of agreeing recommendations, not one round later."""
    state, replicas = ScalerState(), 10
    times = [30.0 * k + (10.0 if k % 2 else -10.0) for k in range(1, 14)]
    rounds = 0
    for t in times:
        decision = scale(replicas, replicas, pool(), SETTINGS, state, t)
        state, replicas, rounds = decision.state, decision.replicas, rounds + 1
        if replicas != 10:
            break
    assert replicas == 6 and rounds == 11  # first at ~30 s, covered at ~330 s
    assert SETTINGS.whole_intervals(100.0) == 120.0  # never shorter than asked
    assert SETTINGS.is_covered(0.0, 106.0, 100.0) and not SETTINGS.is_covered(0.0, 104.0, 100.0)


def test_the_up_window_steps_only_as_far_as_every_recent_recommendation_asked() -> None:
    windowed = replace(SETTINGS, up_window_s=60.0)
    missed = pool(ttft_hist=hist(5.0, 100))
    first = scale(10, 10, missed, windowed, ScalerState(), 30.0)
    assert (first.replicas, first.reason) == (10, "hold-up-window")
    second = scale(10, 10, missed, windowed, first.state, 60.0)
    assert second.reason == "hold-up-window"  # 30 s of 60 covered
    third = scale(10, 10, missed, windowed, second.state, 90.0)
    assert (third.replicas, third.reason) == (13, "up-ttft-miss")
