"""Held KV blocks (docs/pd.md): a prefill leg's blocks outlive its request until released,
count as used for admission, and go back exactly once; an abort never holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.kv_blocks import KVBudget
from genpool_core.request import FinishReason, GenRequest
from tests.unit.support import check_invariants, make_scheduler, run_pass


def _leg(request_id: str, prompt_len: int = 40) -> GenRequest:
    return GenRequest(request_id, prompt_len, max_tokens=1, arrival_time=0.0,
                      num_output_tokens=0, holds_kv_at_finish=True)  # fmt: skip


def test_a_finished_prefill_leg_keeps_its_blocks_until_released() -> None:
    scheduler = make_scheduler(kv_budget=KVBudget(8, 16))
    scheduler.add_request(_leg("a"), 0.0)
    plan = run_pass(scheduler, 0.0)  # admitted, prefilled: its one token ends it
    blocks = plan.admitted_blocks[0]
    assert len(blocks) == 3  # 40 + 1 tokens in blocks of 16
    finish = scheduler.step(0.2)
    assert finish.finished_ids == ("a",) and finish.finish_reasons == (FinishReason.LENGTH,)
    assert scheduler.kv.held_ids() == ("a",) and scheduler.kv.held_blocks("a") == blocks
    assert scheduler.kv.num_used == 3 and scheduler.num_residents == 0
    check_invariants(scheduler)
    assert scheduler.release_held("a") is True
    assert scheduler.release_held("a") is False  # a second release is harmless
    assert scheduler.kv.num_used == 0 and scheduler.kv.held_ids() == ()


def test_held_blocks_make_a_waiter_wait_like_any_used_block() -> None:
    scheduler = make_scheduler(kv_budget=KVBudget(4, 16))
    scheduler.add_request(_leg("held", prompt_len=40), 0.0)  # 3 of the 4 blocks
    run_pass(scheduler, 0.0)
    scheduler.postprocess(scheduler.step(0.2), 0.3)  # finished, blocks held
    scheduler.add_request(GenRequest("next", 20, 10, arrival_time=0.3, num_output_tokens=0), 0.3)
    waiting = scheduler.step(0.4)
    assert waiting.admitted_ids == ()  # needs 2 blocks, 1 free
    scheduler.postprocess(waiting, 0.5)
    scheduler.release_held("held")
    assert scheduler.step(0.6).admitted_ids == ("next",)


def test_an_aborted_prefill_leg_holds_nothing() -> None:
    scheduler = make_scheduler(kv_budget=KVBudget(8, 16))
    scheduler.add_request(GenRequest("a", 40, 5, arrival_time=0.0, num_output_tokens=0,
                                     holds_kv_at_finish=True), 0.0)  # fmt: skip
    run_pass(scheduler, 0.0)
    scheduler.abort("a")
    plan = scheduler.step(0.2)
    assert plan.finish_reasons == (FinishReason.ABORT,)
    assert scheduler.kv.held_ids() == () and scheduler.kv.num_used == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.booleans()), min_size=1, max_size=20))
def test_holds_and_releases_in_any_order_lose_no_block(legs: list[tuple[int, bool]]) -> None:
    scheduler = make_scheduler(max_batch_size=8, kv_budget=KVBudget(64, 16))
    now = 0.0
    for i, (prompt_len, _) in enumerate(legs):
        scheduler.add_request(_leg(f"r{i}", prompt_len), now)
    for _ in range(2 * len(legs) + 4):
        run_pass(scheduler, now)
        now += 0.2
        check_invariants(scheduler)
        for i, (_, is_released_early) in enumerate(legs):
            if is_released_early:
                scheduler.release_held(f"r{i}")
    for request_id in scheduler.kv.held_ids():
        assert scheduler.release_held(request_id)
    assert scheduler.num_waiting == 0 and scheduler.kv.num_used == 0
