"""tpot_budget: wait victims by budget left, pause limit, and the window law."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.preemption import (
    GenCapacity,
    PauseLane,
    TpotBudgetPolicy,
    create_gen_preemption,
    is_in_hysteresis,
)
from genpool_core.request import GenRequest, RequestStatus, VictimKind
from genpool_core.stats import TpotModeStats
from tests.unit.support import choose_victim, make_active


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
    victim = choose_victim(policy, [short_run, long_run], now)
    assert victim is not None and victim.request is long_run
    assert victim.kind is VictimKind.WAIT and victim.resume_due == pytest.approx(now + 0.25)
    assert choose_victim(policy, [short_run], now) is None
    long_run.paused_time = 0.6  # 0.8 - 0.6 = 0.2 left: less than a window
    assert choose_victim(policy, [long_run], now) is None


def test_max_pauses_per_request_refuses_the_third() -> None:
    policy = tpot_policy(0.5)
    request = make_active("r", max_tokens=500, gen_tokens=100, now=10.0, unpaused=10.0)
    request.num_pauses = 2
    assert choose_victim(policy, [request], 10.0) is None
    request.num_pauses = 1
    assert choose_victim(policy, [request], 10.0) is not None


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


def test_mode_stats_report_budget_window_and_inflation() -> None:
    policy = tpot_policy(0.2)
    assert policy.mode_stats(0.0, []) == TpotModeStats(budget=0.2, window_s=0.25)
    finish_paused(policy, paused=0.5, unpaused=10.0)
    policy.on_stat_period(30.0)
    assert policy.mode_stats(30.0, []).inflation == pytest.approx(0.05)


def scan_reference(policy: TpotBudgetPolicy, batch: list[GenRequest], now: float) -> list[str]:
    """The whole-batch scan the kept order replaces (most budget left, then batch order)."""
    ranked = []
    for order, request in enumerate(batch):
        if request.num_pauses >= policy.max_pauses or is_in_hysteresis(request, now):
            continue
        left = policy.budget_left(request, now)
        if left >= policy.window_s:
            ranked.append((-left, order, request.request_id))
    return [request_id for _, _, request_id in sorted(ranked)]


run_state = st.tuples(
    st.sampled_from([0.0, 0.5, 3.0, 12.5]),  # unpaused before this run
    st.sampled_from([0.0, 0.01, 0.2, 1.0]),  # paused time
    st.integers(0, 3),  # pauses so far
    st.integers(0, 8),  # tokens this run
    st.sampled_from([0.0, 1.0, 7.25, 20.0]),  # run started this long before now
)


@given(
    states=st.lists(run_state, min_size=0, max_size=24),
    leavers=st.sets(st.integers(0, 23)),
    epoch=st.sampled_from([0.0, 1e3, 4e6]),
    budget=st.sampled_from([0.05, 0.1, 1.0]),
)
@settings(max_examples=300, deadline=None)
def test_kept_order_ranks_exactly_as_a_whole_batch_scan(
    states: list[tuple[float, float, int, int, float]],
    leavers: set[int],
    epoch: float,
    budget: float,
) -> None:
    # Many equal states: ties must fall back to batch order as in the scan.
    policy = tpot_policy(budget)
    now = epoch + 30.0
    batch = []
    for number, (unpaused, paused, pauses, tokens, ran) in enumerate(states):
        request = GenRequest(f"r{number}", prompt_len=8, max_tokens=500, arrival_time=0.0)
        request.status = RequestStatus.ACTIVE
        request.unpaused_decode_time, request.paused_time = unpaused, paused
        request.num_pauses = pauses
        request.active_since = request.run_started_at = now - ran
        request.tokens_at_run_start = 10
        request.num_output_tokens = 10 + tokens
        policy.on_batch_enter(request)
        batch.append(request)
    for number in sorted(leavers & set(range(len(batch))), reverse=True):
        policy.on_batch_leave(batch.pop(number))
    expected = scan_reference(policy, batch, now)
    got = []
    for victim in policy.choose_victims(now):
        got.append(victim.request.request_id)
        policy.on_batch_leave(victim.request)  # as the scheduler does, mid-ranking
        joiner = GenRequest(f"j{len(got)}", prompt_len=8, max_tokens=500, arrival_time=0.0)
        joiner.status, joiner.active_since, joiner.run_started_at = RequestStatus.ACTIVE, now, now
        policy.on_batch_enter(joiner)  # joins in hysteresis: never ranked this pass
    assert got == expected
