"""Per-request output floors in the modes without a pool floor (off, tpot_budget) and
through the scheduler: attainment is counted against each request's own T_i."""

from __future__ import annotations

import pytest

from genpool_core.preemption import GenCapacity, create_gen_preemption
from genpool_core.preemption.tpot import TpotBudgetPolicy, keeps_floor_through
from genpool_core.request import GenRequest
from genpool_core.statline import format_statline, make_statline
from tests.unit.support import keyed, make_active, make_scheduler, run_pass


def finished_at_rate(request_id: str, tps: float | None, rate: float) -> GenRequest:
    """A completed request whose realised output rate is ``rate`` (11 tokens)."""
    request = make_active(request_id, max_tokens=11, gen_tokens=10, now=0.0)
    request.first_token_time, request.last_token_time = 0.0, 10 / rate
    request.target_output_tps = tps
    return request


@pytest.mark.parametrize("settings", [{}, {"tpot_budget": 0.2}])
def test_modes_without_a_pool_floor_count_only_own_floors(settings: dict[str, object]) -> None:
    policy = create_gen_preemption(settings, GenCapacity(8))
    assert policy.on_complete(finished_at_rate("pool", None, 5.0), 1.0) is None
    assert policy.on_complete(finished_at_rate("missed", 10.0, 5.0), 1.0) is True
    assert policy.on_complete(finished_at_rate("met", 4.0, 5.0), 1.0) is False
    uncounted = finished_at_rate("warmup", 10.0, 5.0)
    uncounted.is_slo_counted = False
    assert policy.on_complete(uncounted, 1.0) is None


def test_a_wait_victim_keeps_its_own_floor_through_the_window() -> None:
    # 10 intervals since the first token at 0: at now = 1 the rate is 10 tokens/s.
    request = make_active("r", max_tokens=100, gen_tokens=10, now=1.0)
    assert keeps_floor_through(request, 1.0, 0.25)  # no own floor: the budget decides
    request.target_output_tps = 8.0  # 10 / 1.25 = 8: exactly kept
    assert keeps_floor_through(request, 1.0, 0.25)
    request.target_output_tps = 9.0
    assert not keeps_floor_through(request, 1.0, 0.25)


def test_tpot_budget_passes_over_a_victim_whose_floor_a_window_would_break() -> None:
    policy = create_gen_preemption({"tpot_budget": 1.0}, GenCapacity(8))
    assert isinstance(policy, TpotBudgetPolicy)
    now = 10.0  # both ran 10 s unpaused: budget left 10 s each, ties in batch order
    first = make_active("first", max_tokens=500, gen_tokens=100, now=now, unpaused=10.0)
    second = make_active("second", max_tokens=500, gen_tokens=100, now=now, unpaused=10.0)
    policy.on_batch_enter(first)
    policy.on_batch_enter(second)
    assert [v.request.request_id for v in policy.choose_victims(now)] == ["first", "second"]
    first.target_output_tps = 9.9  # 100 tokens in 10 s + a 0.25 s window: 9.76/s
    assert [v.request.request_id for v in policy.choose_victims(now)] == ["second"]


def test_statline_shows_own_floor_attainment_only_where_counted() -> None:
    scheduler = make_scheduler(4)  # off: no pool floor
    scheduler.add_request(keyed("pool", arrival=0.0, max_tokens=4), 0.0)
    for number in range(8):
        run_pass(scheduler, 0.1 * number)
    quiet = format_statline(make_statline(scheduler.make_stats(1.0), None))
    assert "below_target=" not in quiet
    tight = keyed("tight", arrival=1.0, max_tokens=4)
    tight.target_output_tps = 1000.0  # 0.1 s passes: 10 tokens/s, far below
    scheduler.add_request(tight, 1.0)
    for number in range(8):
        run_pass(scheduler, 1.0 + 0.1 * number)
    stats = scheduler.make_stats(2.0)
    assert (stats.slo_completed, stats.below_target) == (1, 1)  # before X's warm-up, too
    assert "below_target=1.000/1.000" in format_statline(make_statline(stats, None))


@pytest.mark.parametrize("own_target", [None, 0.2])
def test_a_waiter_with_its_own_target_pauses_a_loose_resident_before_x_warms_up(
    own_target: float | None,
) -> None:
    settings = {"target_output_tps": 10.0, "paused_cap": 2, "resident_headroom": 2}
    scheduler = make_scheduler(2, settings)
    for name in ("loose_a", "loose_b"):
        request = keyed(name, arrival=0.0, max_tokens=20)
        request.target_output_tps = 0.5  # D = 38 s: plenty of laxity
        scheduler.add_request(request, 0.0)
    now = 0.0
    for _ in range(10):  # out of hysteresis: 10 tokens, 1 s >= 0.02 D
        run_pass(scheduler, now)
        now += 0.1
    waiter = keyed("waiter", arrival=now, max_tokens=20)
    waiter.slo_ttft_s = own_target
    scheduler.add_request(waiter, now)
    plan = run_pass(scheduler, now + 0.1)
    assert scheduler.queue.target.value is None  # X has not warmed up
    if own_target is None:  # a pool waiter is never at risk before X exists
        assert plan.paused_ids == () and scheduler.num_waiting == 1
    else:
        assert plan.paused_ids == ("loose_a",) and plan.admitted_ids == ("waiter",)
