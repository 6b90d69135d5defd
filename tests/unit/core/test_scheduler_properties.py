"""Randomised long runs: capacity invariants after every pass, conservation, determinism.

Hypothesis drives arrivals (keyed and unkeyed), EOS stops, aborts of waiting,
active and paused requests, and live changes of H and P within the ceiling.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genpool_core.admission import QueueFullError
from genpool_core.knobs import Knobs
from genpool_core.kv_blocks import KVBudget
from genpool_core.request import GenRequest, RequestStatus
from genpool_core.scheduler import GenScheduler
from tests.unit.support import check_invariants, make_scheduler

MODES: list[dict[str, object]] = [
    {},
    {"tpot_budget": 1.0, "max_pauses_per_request": 3},
    {"target_output_tps": 12.0},
]

event = st.one_of(
    st.tuples(st.just("arrive"), st.integers(2, 120), st.integers(0, 4)),
    st.tuples(st.just("stop"), st.integers(0, 10**6), st.booleans()),
    st.tuples(st.just("abort"), st.integers(0, 10**6), st.booleans()),
    st.tuples(st.just("knobs"), st.integers(0, 8), st.integers(0, 8)),
    st.tuples(st.just("step"), st.integers(1, 6), st.booleans()),
)


def run(
    mode: Mapping[str, object],
    events: list[tuple[str, int, int]],
    b: int,
    kv_blocks: int | None = None,
) -> list[str]:
    """``kv_blocks``: a KV budget of that many 16-token blocks (at least 9: the largest
    request, 8 + 124 tokens, must fit), else none."""
    settings_: dict[str, object] = dict(mode)
    if mode:
        settings_ |= {"paused_cap": 3, "resident_headroom": 4, "max_resident_headroom": 8}
    budget = None if kv_blocks is None else KVBudget(kv_blocks, 16)
    scheduler = make_scheduler(b, settings_, target_x=0.3, max_queue_length=40, kv_budget=budget)
    now, counter, digests = 0.0, 0, []
    known: list[GenRequest] = []
    for kind, x, y in events:
        if kind == "arrive":  # a burst of y + 1 requests, the last one unkeyed when y = 0
            for i in range(int(y) + 1):
                counter += 1
                request = GenRequest(
                    f"r{counter}",
                    8,
                    int(x) + i,
                    arrival_time=now if y else None,
                    first_token_time=now if i % 2 == 0 else None,
                    num_output_tokens=1 if i % 2 == 0 else 0,  # odd ones: prefill here
                )
                try:
                    scheduler.add_request(request, now)
                    known.append(request)
                except QueueFullError:
                    assert scheduler.num_waiting == 40
        elif kind == "abort" and known:
            target = known[int(x) % len(known)]
            if target.status is not RequestStatus.FINISHED and target.finish_reason is None:
                scheduler.abort(target.request_id)
        elif kind == "knobs" and mode:
            headroom = int(x)
            scheduler.set_knobs(Knobs(headroom, min(int(y), headroom)))
        elif kind == "step":
            for _ in range(int(x)):
                plan = scheduler.step(now)
                check_invariants(scheduler)
                assert set(plan.batch_ids).isdisjoint(plan.paused_in_place_ids)
                assert len(set(plan.batch_slots + plan.paused_in_place_slots)) == len(
                    plan.batch_slots
                ) + len(plan.paused_in_place_slots)
                assert scheduler.slots.dummy_slot not in plan.batch_slots
                assert plan.prefill_ids == tuple(
                    i for i in plan.batch_ids if scheduler.get_request(i).num_output_tokens == 0
                )
                stops = tuple(plan.batch_ids[: 1 if y else 0])
                now += 0.05
                scheduler.postprocess(plan, now, stops)
                digests.append(plan.digest())
    drain(scheduler, now)
    check_conservation(scheduler, known)
    return digests


def drain(scheduler: GenScheduler, now: float) -> None:
    for _ in range(20000):
        if not (scheduler.num_residents or scheduler.num_waiting):
            return
        plan = scheduler.step(now)
        check_invariants(scheduler)
        now += 0.05
        scheduler.postprocess(plan, now)
    raise AssertionError("the scheduler did not drain")


def check_conservation(scheduler: GenScheduler, known: list[GenRequest]) -> None:
    stats = scheduler.make_stats(0.0 if scheduler._last_now is None else scheduler._last_now)
    assert all(r.status is RequestStatus.FINISHED for r in known)
    assert stats.completed + stats.aborted == len(known)
    for request in known:
        if request.finish_reason is not None and request.finish_reason.value == "length":
            assert request.num_output_tokens == request.max_tokens
        assert request.num_output_tokens <= request.max_tokens
    assert scheduler.slots.num_used == 0 and scheduler.num_paused == 0
    assert scheduler.kv.num_used == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(MODES),
    events=st.lists(event, min_size=20, max_size=300),
    b=st.integers(1, 6),
    kv_blocks=st.one_of(st.none(), st.integers(9, 40)),
)
def test_invariants_conservation_and_determinism(
    mode: dict[str, object], events: list[tuple[str, int, int]], b: int, kv_blocks: int | None
) -> None:
    first = run(mode, events, b, kv_blocks)
    assert first == run(mode, events, b, kv_blocks)


def test_the_random_runs_do_pause_and_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the property test above against generating only idle runs."""
    events: list[tuple[str, int, int]] = []
    for i in range(150):
        events.append(("arrive", 20 + (i * 7) % 90, 3))
        events.append(("step", 3, i % 5 == 0))
    pauses = []
    original = GenScheduler.step

    def counting_step(self: GenScheduler, now: float):  # type: ignore[no-untyped-def]
        plan = original(self, now)
        pauses.append(len(plan.paused_ids))
        return plan

    monkeypatch.setattr(GenScheduler, "step", counting_step)
    for mode in MODES[1:]:
        pauses.clear()
        run(mode, events, 4)
        assert sum(pauses) >= 10, mode
