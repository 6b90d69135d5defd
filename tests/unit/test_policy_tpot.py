"""tpot_budget: wait victims by budget left, pause limit, and the window law."""

import pytest

from genpool_core.preemption import (
    GenCapacity,
    PauseLane,
    TpotBudgetPolicy,
    create_gen_preemption,
)
from genpool_core.request import VictimKind
from tests.unit.support import make_active


def tpot_policy(budget: float = 0.1) -> TpotBudgetPolicy:
    policy = create_gen_preemption({"tpot_budget": budget}, GenCapacity(8))
    assert isinstance(policy, TpotBudgetPolicy)
    return policy


def test_wait_victim_has_the_most_budget_left_of_at_least_one_window() -> None:
    policy = tpot_policy(0.1)
    now = 10.0
    long_run = make_active("long", max_tokens=500, gen_tokens=100, now=now, unpaused=8.0)
    short_run = make_active("short", max_tokens=500, gen_tokens=20, now=now, unpaused=2.0)
    # budget_left = 0.1 * unpaused - paused: 0.8 vs 0.2 (< window 0.25)
    assert policy.budget_left(long_run, now) == pytest.approx(0.8)
    victim = policy.choose_victim([short_run, long_run], now)
    assert victim is not None and victim.request is long_run
    assert victim.kind is VictimKind.WAIT and victim.resume_due == pytest.approx(now + 0.25)
    assert policy.choose_victim([short_run], now) is None
    long_run.paused_time = 0.6  # 0.8 - 0.6 = 0.2 left: less than a window
    assert policy.choose_victim([long_run], now) is None


def test_max_pauses_per_request_refuses_the_third() -> None:
    policy = tpot_policy(0.5)
    request = make_active("r", max_tokens=500, gen_tokens=100, now=10.0, unpaused=10.0)
    request.num_pauses = 2
    assert policy.choose_victim([request], 10.0) is None
    request.num_pauses = 1
    assert policy.choose_victim([request], 10.0) is not None


def finish_paused(policy: TpotBudgetPolicy, paused: float, unpaused: float) -> None:
    request = make_active("c", max_tokens=50, gen_tokens=49, now=unpaused, unpaused=unpaused)
    request.num_pauses = 1
    request.paused_time = paused
    PauseLane().release(request, unpaused)
    assert policy.on_complete(request, unpaused) is None  # no rate target in this mode


def test_window_law_lengthens_when_under_budget_and_shortens_over() -> None:
    policy = tpot_policy(0.1)
    policy.on_stat_period(30.0)
    assert policy.window_s == 0.25  # no paused completions: no change
    finish_paused(policy, paused=0.25, unpaused=10.0)  # inflation 0.025 = b / 4
    policy.on_stat_period(60.0)
    assert policy.window_s == pytest.approx(0.5)  # factor sqrt(4) = 2
    assert policy.last_inflation == pytest.approx(0.025)
    finish_paused(policy, paused=4.0, unpaused=10.0)  # 0.4 = 4 b: factor 1/2
    policy.on_stat_period(90.0)
    assert policy.window_s == pytest.approx(0.25)
    finish_paused(policy, paused=0.0001, unpaused=10.0)  # far under: step capped at 2x
    policy.on_stat_period(120.0)
    assert policy.window_s == pytest.approx(0.5)


def test_window_stays_within_bounds() -> None:
    policy = tpot_policy(0.1)
    for period in range(40):
        finish_paused(policy, paused=1e-9, unpaused=10.0)
        policy.on_stat_period(30.0 * period)
    assert policy.window_s == TpotBudgetPolicy.MAX_WINDOW_S
    for period in range(40):
        finish_paused(policy, paused=100.0, unpaused=10.0)
        policy.on_stat_period(30.0 * period)
    assert policy.window_s == TpotBudgetPolicy.MIN_WINDOW_S


def test_stat_fields_report_budget_window_and_inflation() -> None:
    policy = tpot_policy(0.2)
    assert policy.stat_fields(0.0, []) == {"budget": 0.2, "window": 0.25}
    finish_paused(policy, paused=0.5, unpaused=10.0)
    policy.on_stat_period(30.0)
    assert policy.stat_fields(30.0, [])["inflation"] == pytest.approx(0.05)
