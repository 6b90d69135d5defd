"""target_output_tps: laxity, victim classes, pause limits, forced resume, credit."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.preemption import GenCapacity, TargetOutputTpsPolicy, create_gen_preemption
from genpool_core.request import FinishReason, VictimKind
from genpool_core.stats import SloModeStats
from tests.unit.slo_oracle import (
    T,
    batch_state,
    rank_victims,
    ranking_scenario,
    slo_policy,
)
from tests.unit.support import choose_victim, make_active


def test_laxity_formula() -> None:
    policy = slo_policy()
    # D = 100 / 10 = 10 s; 20 tokens in 1 s -> r = 20; remaining 80 -> done at now + 4.
    request = make_active("r", max_tokens=101, gen_tokens=20, now=1.0, unpaused=1.0)
    assert policy.decode_span(request) == 10.0
    assert policy.laxity(request, 1.0) == pytest.approx(10.0 - 5.0)


def test_rate_prior_from_step_times_until_a_few_tokens() -> None:
    policy = slo_policy()
    # 2 tokens decoded here (< 4): r is the prior, not 2 / 0.1; 98 tokens remain, D = 10.
    fresh = make_active("r", max_tokens=101, gen_tokens=2, now=1.0, unpaused=0.1)
    assert policy.laxity(fresh, 1.0) == pytest.approx(10.0 - (1.0 + 98 / T))  # no step yet: T
    policy.on_step_time(0.05)
    assert policy.laxity(fresh, 1.0) == pytest.approx(10.0 - (1.0 + 98 / 20.0))  # 1 / 0.05
    policy.on_step_time(0.15)  # EMA: 0.9 * 0.05 + 0.1 * 0.15
    assert policy.step_time_s == pytest.approx(0.06)


def test_laxity_victim_is_the_largest_laxity_with_forced_resume_due() -> None:
    policy = slo_policy()
    now = 2.0
    small = make_active("small", max_tokens=101, gen_tokens=30, now=now, unpaused=2.0)
    big = make_active("big", max_tokens=201, gen_tokens=40, now=now, unpaused=2.0)
    # small: r=15, remaining 70 -> 4.667 s; L = 10 - 6.667 = 3.333
    # big:   r=20, remaining 160 -> 8 s;    L = 20 - 10 = 10, D = 20
    victim = choose_victim(policy, [small, big], now)
    assert victim is not None and victim.request is big and victim.kind is VictimKind.LAXITY
    assert victim.laxity == pytest.approx(10.0)
    # due = now + min(L - 0.01 D, 0.35 D) = 2 + min(9.8, 7.0)
    assert victim.resume_due == pytest.approx(9.0)
    only_small = choose_victim(policy, [small], now)
    assert only_small is not None
    # the laxity margin branch: 2 + min(3.333 - 0.1, 3.5)
    assert only_small.resume_due == pytest.approx(now + 10.0 - 20.0 / 3 - 0.1)


def test_laxity_below_the_minimum_fraction_is_not_a_laxity_victim() -> None:
    policy = slo_policy()
    # r = 10 = T exactly: L = 0 < 0.02 D, and not below target either.
    on_floor = make_active("f", max_tokens=101, gen_tokens=10, now=1.0, unpaused=1.0)
    assert policy.laxity(on_floor, 1.0) == pytest.approx(0.0)
    assert choose_victim(policy, [on_floor], 1.0) is None


def test_laxity_pause_limit_then_below_target_class() -> None:
    policy = slo_policy()
    now = 2.0
    rich = make_active("rich", max_tokens=201, gen_tokens=40, now=now, unpaused=2.0)
    rich.num_pauses = TargetOutputTpsPolicy.MAX_LAXITY_PAUSES
    late_old = make_active("late_old", max_tokens=101, gen_tokens=5, now=now, unpaused=1.0)
    late_young = make_active(
        "late_young", max_tokens=101, gen_tokens=5, now=now, unpaused=1.0, resident_since=0.5
    )
    assert policy.laxity(late_old, now) < 0
    victim = choose_victim(policy, [late_young, rich, late_old], now)
    assert victim is not None
    assert victim.request is late_old and victim.kind is VictimKind.BELOW_TARGET
    assert victim.resume_due == pytest.approx(now + 0.15 * 10.0)
    late_old.num_pauses = TargetOutputTpsPolicy.MAX_BELOW_TARGET_PAUSES
    again = choose_victim(policy, [late_young, rich, late_old], now)
    assert again is not None and again.request is late_young


def test_sacrifice_needs_credit_and_spends_it() -> None:
    policy = slo_policy()
    now = 1.0
    young = make_active(
        "young", max_tokens=101, gen_tokens=10, now=now, unpaused=1.0, resident_since=0.5
    )
    old = make_active("old", max_tokens=101, gen_tokens=10, now=now, unpaused=1.0)
    assert choose_victim(policy, [young, old], now) is None  # credit 0
    policy.credit = 1.5
    victim = choose_victim(policy, [young, old], now)
    assert victim is not None and victim.request is old
    assert victim.kind is VictimKind.SACRIFICED and policy.credit == 1.5  # choosing is pure
    policy.on_pause(victim)
    assert old.is_sacrificed and policy.credit == pytest.approx(0.5)
    assert victim.resume_due == pytest.approx(now + 1.5)


def test_sacrificed_requests_become_below_target_victims() -> None:
    policy = slo_policy()
    request = make_active("s", max_tokens=101, gen_tokens=10, now=1.0, unpaused=1.0)
    request.is_sacrificed = True
    request.num_pauses = 1
    victim = choose_victim(policy, [request], 1.0)
    assert victim is not None and victim.kind is VictimKind.BELOW_TARGET


def test_mode_stats_report_credit_and_paused_below_target() -> None:
    policy = slo_policy()
    policy.credit = 2.5
    sacrificed = make_active("s", max_tokens=101, gen_tokens=10, now=1.0, unpaused=1.0)
    sacrificed.is_sacrificed = True
    plain = make_active("p", max_tokens=101, gen_tokens=10, now=1.0, unpaused=1.0)
    assert policy.mode_stats(1.0, [sacrificed, plain]) == SloModeStats(
        credit=2.5, paused_below_target=1
    )
    off = create_gen_preemption({}, GenCapacity(8))
    assert off.mode_stats(1.0, [plain]) is None  # no gauges of its own


def test_hysteresis_after_resume_in_tokens_and_time() -> None:
    policy = slo_policy()
    now = 2.0
    request = make_active("r", max_tokens=201, gen_tokens=40, now=now, unpaused=2.0)
    request.run_started_at = 1.9
    request.tokens_at_run_start = request.num_output_tokens - 3
    assert policy.is_in_hysteresis(request, now)  # 3 tokens < 4
    request.tokens_at_run_start = request.num_output_tokens - 4
    assert policy.is_in_hysteresis(request, now)  # 0.1 s < 0.02 * D = 0.4 s
    request.run_started_at = 1.5
    assert not policy.is_in_hysteresis(request, now)
    assert choose_victim(policy, [request], now) is not None


def completed(
    policy: TargetOutputTpsPolicy, *, rate: float, sacrificed: bool = False, counted: bool = True
) -> bool | None:
    request = make_active("c", max_tokens=11, gen_tokens=10, now=5.0)
    request.last_token_time = 10.0 / rate
    request.is_sacrificed = sacrificed
    request.is_slo_counted = counted
    request.finish_reason = FinishReason.LENGTH
    return policy.on_complete(request, 5.0)


def test_credit_bucket() -> None:
    policy = slo_policy()
    assert completed(policy, rate=20.0) is False  # on target: +eps
    assert policy.credit == pytest.approx(0.2)
    assert completed(policy, rate=5.0) is True  # below T: +eps - 1
    assert policy.credit == pytest.approx(-0.6)
    completed(policy, rate=5.0, sacrificed=True)  # below, sacrificed: +eps - 1 + 1
    assert policy.credit == pytest.approx(-0.4)
    completed(policy, rate=20.0, sacrificed=True)  # sacrificed but made it: refund
    assert policy.credit == pytest.approx(0.8)
    # warm-up / unkeyed: ignored, and not counted in the SLO statistics
    assert completed(policy, rate=1.0, counted=False) is None
    assert policy.credit == pytest.approx(0.8)
    for _ in range(5000):
        completed(policy, rate=20.0)
    assert policy.credit == pytest.approx(TargetOutputTpsPolicy.CREDIT_BOUND)
    for _ in range(5000):
        completed(policy, rate=1.0)
    assert policy.credit == pytest.approx(-TargetOutputTpsPolicy.CREDIT_BOUND)


def test_no_window_controller_in_slo_mode() -> None:
    policy = slo_policy()
    request = make_active("r", max_tokens=101, gen_tokens=10, now=1.0, unpaused=1.0)
    request.is_sacrificed = True
    before = choose_victim(policy, [request], 1.0)
    for t in range(10):
        policy.on_stat_period(30.0 * t)
    after = choose_victim(policy, [request], 1.0)
    assert before is not None and after is not None
    assert before.resume_due == after.resume_due == pytest.approx(1.0 + 0.15 * 10.0)


def test_enabled_line_lists_knobs_and_constants() -> None:
    line = slo_policy(cap=3).enabled_line()
    assert line.startswith("gen_preemption enabled mode=target_output_tps ")
    for field in (
        "target_output_tps=10.0",
        "paused_cap=3",
        "resident_headroom=3",
        "max_batch_size=8",
        "slack_s=0.5",
        "per_pass_budget=4",
        "eps=0.2",
        "window_fraction=0.15",
        "max_laxity_pauses=8",
        "max_below_target_pauses=3",
        "hysteresis_tokens=4",
    ):
        assert field in line.split(), field


@given(
    states=st.lists(batch_state, max_size=20),
    credit=st.sampled_from([0.0, 2.5]),
    step_time=st.sampled_from([None, 0.03]),
)
@settings(max_examples=300, deadline=None)
def test_the_inlined_scan_ranks_as_the_policy_methods_do(
    states: list[tuple[int, int, float, float, int, bool, float]],
    credit: float,
    step_time: float | None,
) -> None:
    now = 50.0
    policy, batch = ranking_scenario(states, credit, step_time, now)
    expected = rank_victims(policy, batch, now, policy.credit)  # measured by its own methods
    got = []
    for victim in policy.choose_victims(now):
        got.append((victim.request.request_id, victim.kind, victim.resume_due, victim.laxity))
        policy.on_pause(victim)  # a sacrifice spends credit before the next is chosen
    assert got == expected  # exact floats: the inlined arithmetic is the methods'
