"""Per-request SLOs: a request's own admission target D_i and output-rate floor T_i.

Without them every path is the pool's (tests/unit/core/test_scheduler_replay.py pins that);
here: the queue orders mixed waiters by deadline, the SLO policy ranks mixed floors
exactly as a brute force does, and every mode counts attainment against each
request's own floor.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.admission import AdaptiveTarget, AdmissionQueue
from genpool_core.request import GenRequest, VictimKind
from tests.unit.slo_oracle import (
    Formulas,
    T,
    batch_state_with_floor,
    rank_victims,
    ranking_scenario,
    slo_policy,
)
from tests.unit.support import choose_victim, keyed, make_active


def with_slo(
    request: GenRequest, ttft_s: float | None = None, tps: float | None = None
) -> GenRequest:
    request.slo_ttft_s, request.target_output_tps = ttft_s, tps
    return request


# -- the request ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "5"])
@pytest.mark.parametrize("field", ["slo_ttft_s", "target_output_tps"])
def test_validate_names_a_bad_per_request_slo(field: str, bad: object) -> None:
    request = keyed("r", arrival=0.0)
    setattr(request, field, bad)
    with pytest.raises(ValueError, match=field):
        request.validate()


# -- admission: D_i ---------------------------------------------------------------------


def make_queue(x: float | None = 2.0, slack_s: float = 0.5) -> AdmissionQueue:
    target = AdaptiveTarget(0.1, 30.0)
    target.value = x
    return AdmissionQueue(64, target, slack_s)


def test_waiters_pop_by_deadline_and_only_pool_waits_feed_x() -> None:
    queue = make_queue(x=2.0)
    queue.push(keyed("pool_old", arrival=5.0))  # deadline 7
    queue.push(with_slo(keyed("tight", arrival=6.0), ttft_s=0.5))  # deadline 6.5
    queue.push(with_slo(keyed("lax", arrival=1.0), ttft_s=9.0))  # deadline 10
    queue.push(keyed("pool_new", arrival=6.5))  # deadline 8.5
    now = 6.6
    assert queue.slack(queue.peek(), now) == pytest.approx(-0.1)  # type: ignore[arg-type]
    assert queue.num_at_risk(now) == 2  # tight (slack -0.1) and pool_old (0.4 <= 0.5)
    order = []
    for _ in range(4):
        before = queue.target.value
        request = queue.pop(now)
        order.append(request.request_id)
        if request.slo_ttft_s is not None:
            assert queue.target.value == before  # D_i is not the pool's to adapt
    assert order == ["tight", "pool_old", "pool_new", "lax"]


def test_own_target_waiters_are_at_risk_before_x_warms_up() -> None:
    queue = make_queue(x=None)
    queue.push(keyed("pool", arrival=0.0))
    queue.push(with_slo(keyed("own", arrival=0.0), ttft_s=1.0))
    assert queue.num_at_risk(0.6) == 1 and queue.is_head_at_risk(0.6)
    assert queue.pop(0.6).request_id == "own"
    assert not queue.is_head_at_risk(0.6)  # the pool waiter has no slack before warm-up


waiter = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0]),  # arrival
    st.sampled_from([None, None, 0.2, 1.0, 3.0]),  # D_i (None: the pool's X)
    st.booleans(),  # removed before popping
)


@given(
    waiters=st.lists(waiter, max_size=25),
    x=st.sampled_from([None, 0.5, 2.0]),
    now=st.sampled_from([4.0, 5.5, 9.0]),
)
@settings(max_examples=300, deadline=None)
def test_queue_ranks_mixed_targets_as_a_brute_force_does(
    waiters: list[tuple[float, float | None, bool]], x: float | None, now: float
) -> None:
    queue = make_queue(x=x)
    kept: list[tuple[float, int, GenRequest]] = []
    for number, (arrival, own, is_removed) in enumerate(waiters):
        request = with_slo(keyed(f"r{number}", arrival=arrival), ttft_s=own)
        queue.push(request)
        if not is_removed:
            pool_x = x if x is not None else 30.0  # x_max before warm-up
            kept.append((arrival + (own if own is not None else pool_x), number, request))
    for number, (_, _, is_removed) in enumerate(waiters):
        if is_removed:
            queue.remove(f"r{number}")
    expected_at_risk = sum(
        1
        for _, _, r in kept
        if (d := r.slo_ttft_s if r.slo_ttft_s is not None else x) is not None
        and d - (now - (r.arrival_time or 0.0)) <= queue.slack_s
    )
    assert queue.num_at_risk(now) == expected_at_risk
    queue.target.value = x  # pops of pool waiters move X; freeze it to compare orders
    got = []
    while len(queue):
        got.append(queue.pop(now).request_id)
        queue.target.value = x
    assert got == [r.request_id for _, _, r in sorted(kept, key=lambda e: (e[0], e[1]))]


# -- the SLO policy: T_i ----------------------------------------------------------------


def test_the_span_laxity_and_below_target_use_the_requests_own_floor() -> None:
    policy = slo_policy()
    # 20 tokens in 1 s (r = 20), 80 remaining: finishes at now + 4.
    pool = make_active("pool", max_tokens=101, gen_tokens=20, now=1.0, unpaused=1.0)
    tight = with_slo(make_active("tight", max_tokens=101, gen_tokens=20, now=1.0, unpaused=1.0))
    tight.target_output_tps = 25.0
    assert policy.decode_span(pool) == 10.0 and policy.decode_span(tight) == 4.0
    assert policy.laxity(pool, 1.0) == pytest.approx(10.0 - 5.0)
    assert policy.laxity(tight, 1.0) == pytest.approx(4.0 - 5.0)  # already late
    victim = choose_victim(policy, [tight, pool], 1.0)
    assert victim is not None and victim.request is pool and victim.kind is VictimKind.LAXITY
    pool.last_token_time = tight.last_token_time = 1.0
    assert not policy.is_below_target(pool) and policy.is_below_target(tight)
    assert policy.on_complete(tight, 1.0) is True
    assert policy.on_complete(pool, 1.0) is False


def test_a_fresh_request_without_a_step_time_runs_at_its_own_floor() -> None:
    policy = slo_policy()
    fresh = make_active("fresh", max_tokens=101, gen_tokens=2, now=1.0, unpaused=0.1)
    fresh.target_output_tps = 50.0  # D = 2 s; the prior rate is 50 until a step is seen
    assert policy.laxity(fresh, 1.0) == pytest.approx(2.0 - (1.0 + 98 / 50.0))


@given(
    states=st.lists(batch_state_with_floor, max_size=20),
    credit=st.sampled_from([0.0, 2.5]),
    step_time=st.sampled_from([None, 0.03]),
    earlier=st.sampled_from([None, 49.0, 49.9]),
)
@settings(max_examples=300, deadline=None)
def test_mixed_floors_rank_as_a_brute_force_does_across_passes(
    states: list[tuple[int, int, float, float, int, bool, float, float | None]],
    credit: float,
    step_time: float | None,
    earlier: float | None,
) -> None:
    """The incremental scan (per-run constants cached at batch entry, hysteresis
    remembered across passes, a heap of laxity victims) against a from-scratch ranking."""
    now = 50.0
    policy, batch = ranking_scenario(states, credit, step_time, now)
    if earlier is not None:
        list(policy.choose_victims(earlier))  # an earlier pass: caches hysteresis states
    expected = rank_victims(Formulas(T, policy.step_time_s), batch, now, credit)
    got = []
    for victim in policy.choose_victims(now):
        got.append((victim.request.request_id, victim.kind, victim.resume_due, victim.laxity))
        policy.on_pause(victim)
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    for (_, _, due, lax), (_, _, want_due, want_lax) in zip(got, expected, strict=True):
        assert due == pytest.approx(want_due, rel=1e-12, abs=1e-12)
        if want_lax is None:
            assert lax is None
        else:
            assert lax == pytest.approx(want_lax, rel=1e-12, abs=1e-12)
