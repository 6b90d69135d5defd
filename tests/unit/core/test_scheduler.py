"""Full passes: pause/resume timelines, slots kept, releases, stat lines, bad input."""

import math

import pytest
from pydantic import ValidationError

from genpool_core.admission import QueueFullError
from genpool_core.knobs import Knobs
from genpool_core.live import LiveUpdate
from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason, GenRequest, RequestStatus
from genpool_core.scheduler import GenScheduler, UnknownRequestError
from genpool_core.statline import parse_statline
from tests.unit.support import check_invariants, keyed, make_scheduler, run_pass, unkeyed

DT = 0.0625  # exact in binary, so the timelines below are exact


def drive(
    scheduler: GenScheduler,
    until: float,
    arrivals: dict[float, list[GenRequest]],
    start: float = 0.0,
) -> list[tuple[float, GenPlan]]:
    """Run passes every DT from ``start``, adding arrivals when due; eventful plans."""
    events: list[tuple[float, GenPlan]] = []
    t = start
    while t < until:
        for at in sorted(arrivals):
            if at <= t:
                for request in arrivals.pop(at):
                    scheduler.add_request(request, t)
        plan = run_pass(scheduler, t, DT)
        check_invariants(scheduler)
        if plan.paused_ids or plan.resumed_ids or plan.admitted_ids or plan.finished_ids:
            events.append((t, plan))
        t += DT
    return events


def test_tpot_request_paused_twice_then_third_pause_refused() -> None:
    scheduler = make_scheduler(
        1, {"tpot_budget": 0.5, "paused_cap": 1, "resident_headroom": 1}, target_x=1.0
    )
    arrivals = {
        0.0: [keyed("r1", 0.0, max_tokens=1001)],
        1.0: [keyed("r2", 1.0, max_tokens=3)],
        1.75: [keyed("r3", 1.75, max_tokens=3)],
        2.75: [keyed("r4", 2.75, max_tokens=3)],
    }
    events = drive(scheduler, 5.0, arrivals)
    timeline = [(t, p.paused_ids, p.resumed_ids, p.admitted_ids) for t, p in events]
    assert timeline == [
        (0.0, (), (), ("r1",)),
        (1.5, ("r1",), (), ("r2",)),  # r2 at risk: slack X - 0.5 = 0.5 <= slack_s
        (1.625, (), ("r1",), ()),  # r2 done, r1 takes its position back early
        (2.25, ("r1",), (), ("r3",)),  # second pause
        (2.375, (), ("r1",), ()),
    ]
    r1 = scheduler.get_request("r1")
    assert r1.num_pauses == 2 and r1.paused_time == pytest.approx(0.25)
    # r4 has been at risk since 3.25, but r1 is at max_pauses_per_request = 2.
    assert scheduler.num_waiting == 1 and scheduler.queue.is_head_at_risk(5.0)
    assert scheduler.pausing.counters.pauses == 2


def test_slo_full_pass_pauses_the_laxity_victim_and_keeps_its_slot() -> None:
    scheduler = make_scheduler(
        2, {"target_output_tps": 10.0, "paused_cap": 1, "resident_headroom": 1}, target_x=1.0
    )
    scheduler.add_request(keyed("r1", 0.0, max_tokens=101), 0.0)
    scheduler.add_request(keyed("r2", 0.0, max_tokens=201), 0.0)
    t = 0.0
    while t < 1.5:
        run_pass(scheduler, t, DT)
        t += DT
    scheduler.add_request(keyed("r3", 1.0, max_tokens=101), 1.5)
    plan = scheduler.step(1.5)
    # 24 tokens in 1.5 s -> r = 16 tok/s. r1: L = 10 - (1.5 + 76/16) = 3.75;
    # r2: D = 20, L = 20 - (1.5 + 176/16) = 7.5 -> r2 is the laxity victim.
    assert plan.paused_ids == ("r2",) and plan.admitted_ids == ("r3",)
    assert plan.batch_ids == ("r1", "r3") and plan.batch_slots == (0, 2)
    assert plan.paused_in_place_ids == ("r2",) and plan.paused_in_place_slots == (1,)
    r2 = scheduler.get_request("r2")
    assert r2.status is RequestStatus.PAUSED and r2.slot == 1
    assert r2.resume_due == pytest.approx(1.5 + min(7.5 - 0.2, 0.35 * 20))
    assert scheduler.pausing.counters.victims == {"laxity": 1}
    assert scheduler.pausing.counters.laxity_sum == pytest.approx(7.5)
    check_invariants(scheduler)


def test_finish_or_abort_while_paused_releases_the_slot() -> None:
    scheduler = make_scheduler(
        1, {"tpot_budget": 0.5, "paused_cap": 1, "resident_headroom": 1}, target_x=1.0
    )
    drive(scheduler, 1.5, {0.0: [keyed("r1", 0.0, max_tokens=1001)]})
    scheduler.add_request(keyed("r2", 0.5, max_tokens=100), 1.5)
    plan = run_pass(scheduler, 1.5, DT)
    assert plan.paused_ids == ("r1",)
    plan = scheduler.step(1.5625)
    with pytest.raises(ValueError, match="not in this pass's batch"):
        scheduler.postprocess(plan, 1.625, stop_ids=("r1",))
    scheduler.postprocess(plan, 1.625)  # the rejected call changed nothing
    scheduler.abort("r1")  # client went away while paused
    plan = run_pass(scheduler, 1.625, DT)
    assert plan.finished_ids == ("r1",) and plan.paused_in_place_ids == ()
    assert scheduler.num_paused == 0 and scheduler.slots.num_used == 1
    assert scheduler.make_stats(1.7).aborted == 1
    with pytest.raises(UnknownRequestError):
        scheduler.get_request("r1")


def test_due_resumes_take_free_positions_before_admissions_in_due_order() -> None:
    scheduler = make_scheduler(
        2,
        {"target_output_tps": 10.0, "paused_cap": 2, "resident_headroom": 2},
        target_x=1.0,
    )
    scheduler.add_request(keyed("a", 0.0, max_tokens=401), 0.0)  # D = 40
    scheduler.add_request(keyed("b", 0.0, max_tokens=201), 0.0)  # D = 20
    t = 0.0
    while t < 1.5:
        run_pass(scheduler, t, DT)
        t += DT
    for rid in ("w1", "w2"):
        scheduler.add_request(keyed(rid, 1.0, max_tokens=9), 1.5)
    plan = run_pass(scheduler, 1.5, DT)
    assert plan.paused_ids == ("a", "b")  # most laxity first
    a, b = scheduler.get_request("a"), scheduler.get_request("b")
    assert b.resume_due is not None and a.resume_due is not None
    assert b.resume_due < a.resume_due  # b has less laxity: first in the lane
    assert plan.paused_in_place_ids == ("b", "a")
    # x0 and x1 take the positions w1/w2 free at 2.0 (nobody is due yet). At b's due
    # time (8.5) the batch is full: b swaps with x1 (a laxity victim) instead of
    # waiting for a completion. At 11.0 the queue is empty and a (due 15.5) takes an
    # idle position early.
    scheduler.add_request(keyed("x0", 1.5, max_tokens=129), 1.5625)
    scheduler.add_request(keyed("x1", 1.5, max_tokens=241), 1.5625)
    scheduler.add_request(keyed("x2", 1.5, max_tokens=9), 1.5625)
    scheduler.add_request(keyed("x3", 1.5, max_tokens=9), 1.5625)
    events = drive(scheduler, 11.5, {}, start=1.5625)
    resumes = [(t, p.resumed_ids, p.admitted_ids, p.paused_ids) for t, p in events if p.resumed_ids]
    assert resumes == [(8.5, ("b",), (), ("x1",)), (11.0, ("a",), (), ())]
    assert scheduler.pausing.counters.forced_resumes == 1  # b; a came back early
    assert scheduler.pausing.counters.laxity_resumes == 2


def test_unkeyed_and_warmup_requests_never_trigger_pauses() -> None:
    scheduler = make_scheduler(
        1, {"target_output_tps": 10.0, "paused_cap": 1, "resident_headroom": 1}
    )
    scheduler.add_request(unkeyed("u1", max_tokens=1000), 0.0)
    run_pass(scheduler, 0.0)
    scheduler.add_request(keyed("k", 0.0), 0.1)  # keyed, but X is not initialised yet
    scheduler.add_request(unkeyed("u2"), 0.1)
    for i in range(200):
        plan = run_pass(scheduler, 0.1 * (i + 1))
        assert plan.paused_ids == ()
    assert scheduler.get_request("u1").is_slo_counted is False


def test_preemption_off_never_pauses() -> None:
    scheduler = make_scheduler(2, target_x=0.1)
    for i in range(6):
        scheduler.add_request(keyed(f"r{i}", 0.0, max_tokens=50), 0.0)
    for i in range(100):
        plan = run_pass(scheduler, 0.05 * i, 0.05)
        assert plan.paused_ids == () and len(plan.batch_ids) <= 2
    assert scheduler.slots.num_slots == 2 and scheduler.pausing.counters.pauses == 0


def test_stat_line_every_interval_of_the_pass_clock() -> None:
    scheduler = make_scheduler(
        1,
        {"tpot_budget": 0.5, "paused_cap": 1, "resident_headroom": 1},
        target_x=1.0,
        stat_interval_s=2.0,
    )
    arrivals = {0.0: [keyed("r1", 0.0, max_tokens=1001)], 1.0: [keyed("r2", 1.0, max_tokens=3)]}
    lines: list[tuple[float, str]] = []
    t = 0.0
    while t < 4.5:
        for at in sorted(arrivals):
            if at <= t:
                for request in arrivals.pop(at):
                    scheduler.add_request(request, t)
        plan = run_pass(scheduler, t, DT)
        if plan.stat_line:
            lines.append((t, plan.stat_line))
        t += DT
    assert [t for t, _ in lines] == [2.0, 4.0]
    first = parse_statline(lines[0][1])
    assert first is not None and first.mode == "tpot_budget"
    assert (first.pauses_window, first.pauses_total, first.victims) == (1, 1, {"wait": 1})
    assert (first.completed_window, first.completed_total) == (1, 1)
    assert first.forced_resumes == 0  # r1 took its position back early, before its due
    second = parse_statline(lines[1][1])
    assert second is not None and (second.pauses_window, second.pauses_total) == (0, 1)
    assert lines[0][1].startswith("gen_preemption stats t=2.0 mode=tpot_budget budget=0.500 ")


def test_plans_are_rank_identical_for_identical_inputs() -> None:
    def replay() -> list[str]:
        scheduler = make_scheduler(
            3,
            {"target_output_tps": 8.0, "paused_cap": 2, "resident_headroom": 2},
            target_x=0.5,
        )
        digests = []
        for i in range(400):
            now = i * DT
            if i % 3 == 0:
                scheduler.add_request(keyed(f"r{i}", now, max_tokens=5 + (i * 37) % 90), now)
            plan = scheduler.step(now)
            stops = tuple(rid for rid in plan.batch_ids if hash(rid) % 97 == 0)
            scheduler.postprocess(plan, now + DT, stops)
            digests.append(plan.digest())
        assert scheduler.pausing.counters.pauses > 0  # the run exercises pausing
        return digests

    assert replay() == replay()


def test_bad_times_are_rejected_without_state_change() -> None:
    scheduler = make_scheduler(2, {"target_output_tps": 10.0}, target_x=1.0)
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="now must be"):
            scheduler.step(bad)
    run_pass(scheduler, 5.0)
    with pytest.raises(ValueError, match="before the previous pass"):
        scheduler.step(4.0)
    with pytest.raises(ValueError, match="arrival_time"):
        scheduler.add_request(keyed("future", 9.0), 5.0)
    with pytest.raises(ValueError, match="arrival_time must be a finite"):
        scheduler.add_request(keyed("nan", math.nan), 5.0)
    with pytest.raises(ValueError, match="max_tokens"):
        scheduler.add_request(keyed("zero", 1.0, max_tokens=0), 5.0)
    with pytest.raises(ValueError, match="prompt_len"):
        scheduler.add_request(keyed("neg", 1.0, prompt_len=-3), 5.0)
    assert scheduler.num_waiting == 0


def test_protocol_misuse_is_rejected() -> None:
    scheduler = make_scheduler(2)
    scheduler.add_request(keyed("a", 0.0), 0.0)
    with pytest.raises(ValueError, match="already waiting"):
        scheduler.add_request(keyed("a", 0.0), 0.0)
    plan = scheduler.step(0.0)
    with pytest.raises(ValueError, match="postprocess the previous plan"):
        scheduler.step(0.1)
    scheduler.postprocess(plan, 0.1)
    with pytest.raises(ValueError, match="latest plan, once"):
        scheduler.postprocess(plan, 0.1)
    with pytest.raises(ValueError, match="already resident"):
        scheduler.add_request(keyed("a", 0.0), 0.1)
    with pytest.raises(UnknownRequestError):
        scheduler.abort("nobody")
    assert scheduler.get_request("a").num_output_tokens == 2


def test_queue_full_keeps_everyone_already_accepted() -> None:
    scheduler = make_scheduler(1, max_queue_length=2)
    scheduler.add_request(keyed("a", 0.0), 0.0)
    scheduler.add_request(keyed("b", 0.0), 0.0)
    with pytest.raises(QueueFullError):
        scheduler.add_request(keyed("c", 0.0), 0.0)
    assert scheduler.num_waiting == 2
    plan = run_pass(scheduler, 0.0)
    assert plan.admitted_ids == ("a",)
    scheduler.add_request(keyed("c", 0.0), 0.1)
    assert scheduler.num_waiting == 2


def test_abort_waiting_request_leaves_at_once() -> None:
    scheduler = make_scheduler(1)
    scheduler.add_request(keyed("a", 0.0), 0.0)
    scheduler.abort("a")
    assert scheduler.num_waiting == 0
    plan = run_pass(scheduler, 0.0)
    assert plan.admitted_ids == () and scheduler.make_stats(0.0).aborted == 1


def test_length_and_stop_finish_reasons() -> None:
    scheduler = make_scheduler(2)
    scheduler.add_request(keyed("short", 0.0, max_tokens=3), 0.0)
    scheduler.add_request(keyed("eos", 0.0, max_tokens=50), 0.0)
    run_pass(scheduler, 0.0)
    plan = run_pass(scheduler, 0.1, stop_ids=("eos",))
    assert plan.finished_ids == ()
    plan = run_pass(scheduler, 0.2)
    assert set(plan.finished_ids) == {"short", "eos"}
    assert scheduler.num_residents == 0 and scheduler.slots.num_used == 0
    assert scheduler.make_stats(0.3).completed == 2


def test_live_knobs_validate_then_apply() -> None:
    scheduler = make_scheduler(
        2,
        {
            "target_output_tps": 10.0,
            "paused_cap": 2,
            "resident_headroom": 2,
            "max_resident_headroom": 4,
        },
    )
    config = scheduler.live_config()
    with pytest.raises(ValueError, match=r"within \[0, 4\]"):
        scheduler.set_knobs(Knobs(resident_headroom=5, paused_cap=2))
    with pytest.raises(ValueError, match="paused_cap=3"):
        scheduler.set_knobs(Knobs(resident_headroom=2, paused_cap=3))
    with pytest.raises(ValueError, match="slack_s"):
        scheduler.reconfigure(config.updated(LiveUpdate(generation=0, paused_cap=1,
                                                        slack_s=math.inf)))  # fmt: skip
    assert scheduler.knobs == Knobs(2, 2)  # nothing applied from the failed call
    assert scheduler.live_config() == config
    with pytest.raises(ValueError, match="bounds"):
        scheduler.reconfigure(
            config.updated(
                LiveUpdate(generation=0, admission_target_min_s=9.0, admission_target_max_s=1.0)
            )
        )
    with pytest.raises(ValidationError, match="knobs"):
        LiveUpdate.model_validate({"generation": 0, "knobs": 3})
    assert config.updated(LiveUpdate(generation=3)).generation == 3  # the generation is live
    with pytest.raises(ValidationError, match="paused_cap"):
        LiveUpdate.model_validate({"generation": 0, "paused_cap": 1.5})
    scheduler.reconfigure(
        config.updated(LiveUpdate(generation=0, resident_headroom=4, paused_cap=3, slack_s=1))
    )
    assert scheduler.slots.num_slots == 6 and scheduler.knobs == Knobs(4, 3)
    assert scheduler.queue.slack_s == 1.0
    off = make_scheduler(2)
    with pytest.raises(ValueError, match="preemption is off"):
        off.set_knobs(Knobs(resident_headroom=0, paused_cap=1))


def test_lowering_the_cap_below_paused_stops_new_pauses_without_eviction() -> None:
    scheduler = make_scheduler(
        1, {"tpot_budget": 0.5, "paused_cap": 1, "resident_headroom": 1}, target_x=1.0
    )
    drive(scheduler, 1.5, {0.0: [keyed("r1", 0.0, max_tokens=1001)]})
    scheduler.add_request(keyed("r2", 0.5, max_tokens=400), 1.5)
    run_pass(scheduler, 1.5, DT)
    assert scheduler.num_paused == 1
    scheduler.set_knobs(Knobs(resident_headroom=0, paused_cap=0))
    assert scheduler.capacity_in_force() == (1, 1)
    check_invariants(scheduler)
    assert scheduler.get_request("r1").status is RequestStatus.PAUSED  # not evicted
    t = 1.5625
    while scheduler.num_paused:
        run_pass(scheduler, t, DT)
        check_invariants(scheduler)
        t += DT
    assert scheduler.capacity_in_force() == (0, 0)
    assert scheduler.get_request("r1").finish_reason is None
    assert FinishReason.LENGTH.value == "length"


def test_due_resume_swaps_with_a_fresh_victim_in_a_full_batch() -> None:
    scheduler = make_scheduler(
        1, {"tpot_budget": 2.0, "paused_cap": 1, "resident_headroom": 1}, target_x=1.0
    )
    arrivals = {0.0: [keyed("r1", 0.0, max_tokens=1001)], 1.0: [keyed("r2", 1.0, 400)]}
    events = drive(scheduler, 2.05, arrivals)
    timeline = [(t, p.paused_ids, p.resumed_ids, p.admitted_ids) for t, p in events]
    assert timeline == [
        (0.0, (), (), ("r1",)),
        (1.5, ("r1",), (), ("r2",)),  # r1 paused for one window (0.25 s)
        (1.75, ("r2",), ("r1",), ()),  # due: swaps with r2, which has budget left
        (2.0, ("r1",), ("r2",), ()),  # r2's window ends: r1 (budget left) swaps out
    ]
    r1 = scheduler.get_request("r1")
    assert r1.num_pauses == 2 and r1.paused_time == 0.25  # held one window, not to r2's end
    assert scheduler.pausing.counters.forced_resumes == 2
