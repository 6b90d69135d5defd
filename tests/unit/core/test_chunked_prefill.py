"""Chunked prefill (genpool_core.prefill_budget): a per-pass prefill token budget."""

from __future__ import annotations

import pytest

from genpool_core.kv_blocks import KVBudget
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler
from tests.unit.support import make_scheduler


def fresh(request_id: str, prompt_len: int, max_tokens: int = 5,
          arrival_time: float = 0.0) -> GenRequest:  # fmt: skip
    """A request this worker prefills (no output token yet)."""
    return GenRequest(
        request_id=request_id,
        prompt_len=prompt_len,
        max_tokens=max_tokens,
        arrival_time=arrival_time,
        num_output_tokens=0,
    )


def drive(scheduler: GenScheduler, passes: int, t0: float = 0.0) -> list:  # type: ignore[type-arg]
    plans = []
    for i in range(passes):
        plan = scheduler.step(t0 + i)
        scheduler.postprocess(plan, t0 + i + 0.5)
        plans.append(plan)
    return plans


def behind_a_running_request(s: GenScheduler, prompts: dict[str, int], passes: int) -> list:  # type: ignore[type-arg]
    """A request decoding, then ``prompts`` (id -> length) admitted together at 1.0; the
    plans of the next ``passes`` passes."""
    s.add_request(fresh("run", 3, max_tokens=20), 0.0)
    drive(s, 1)
    for request_id, prompt_len in prompts.items():
        s.add_request(fresh(request_id, prompt_len), 1.0)
    return drive(s, passes, t0=1.0)


def test_a_short_prompt_goes_before_a_long_one_within_the_budget() -> None:
    s = make_scheduler(4, max_prefill_tokens_per_pass=10, kv_budget=KVBudget(64, 4))
    plans = behind_a_running_request(s, {"a": 25, "b": 4}, 4)
    # Neither has a target yet (no warm-up): fewest remaining tokens first; "a", the
    # oldest, keeps its floor and takes what "b" leaves.
    assert [p.prefill_chunks for p in plans] == [
        (("b", 0, 4), ("a", 0, 6)),
        (("a", 6, 16),),
        (("a", 16, 25),),
        (),
    ]
    for plan in plans:
        assert sum(end - start for _, start, end in plan.prefill_chunks) <= 10
    # Mid-prefill: residents holding a position and blocks, not batch members.
    assert plans[0].admitted_ids == ("a", "b") and plans[0].batch_ids == ("run", "b")
    assert plans[0].prefill_ids == ("b",) and plans[1].batch_ids == ("run", "b")
    assert plans[2].prefill_ids == ("a",) and plans[2].batch_ids == ("run", "b", "a")
    assert s.get_request("b").first_token_time == 1.5
    assert s.get_request("a").first_token_time == 3.5
    assert s.get_request("a").num_output_tokens == 2  # passes 2 and 3
    assert plans[3].batch_ids == ("run", "b", "a") and plans[3].prefill_ids == ()


def test_arrival_order_serves_the_oldest_prompt_first() -> None:
    s = make_scheduler(4, max_prefill_tokens_per_pass=10, prefill_order="arrival")
    plans = behind_a_running_request(s, {"a": 25, "b": 4}, 3)
    assert [p.prefill_chunks for p in plans] == [
        (("a", 0, 10),),
        (("a", 10, 20),),
        (("a", 20, 25), ("b", 0, 4)),
    ]
    with pytest.raises(ValueError, match="prefill order must be one of"):
        make_scheduler(4, max_prefill_tokens_per_pass=10, prefill_order="newest")


def test_equal_prompts_are_prefilled_in_admission_order() -> None:
    s = make_scheduler(4, max_prefill_tokens_per_pass=10)
    plans = behind_a_running_request(s, {"a": 20, "b": 20}, 4)
    assert [p.prefill_chunks for p in plans] == [
        (("a", 0, 10),),
        (("a", 10, 20),),
        (("b", 0, 10),),
        (("b", 10, 20),),
    ]


def test_the_oldest_prompt_keeps_a_quarter_of_the_budget_under_a_stream_of_short_ones() -> None:
    s = make_scheduler(12, max_prefill_tokens_per_pass=8)
    s.add_request(fresh("run", 3, max_tokens=100), 0.0)
    drive(s, 1)
    s.add_request(fresh("long", 20), 1.0)
    long_chunks = []
    for k in range(10):  # two short prompts a pass, enough to take the whole budget
        for j in range(2):
            s.add_request(fresh(f"s{k}.{j}", 3, max_tokens=1), 1.0 + k)
        (plan,) = drive(s, 1, t0=1.0 + k)
        long_chunks += [c for c in plan.prefill_chunks if c[0] == "long"]
        assert sum(end - start for _, start, end in plan.prefill_chunks) <= 8
    assert [end - start for _, start, end in long_chunks] == [2] * 10  # 8 // 4 each pass


def test_a_prompt_that_can_still_make_its_target_goes_first() -> None:
    """Laxity = slack - passes left x pass time: the one that can still make its target
    goes first, least laxity first; one that cannot waits behind it."""
    s = make_scheduler(4, max_prefill_tokens_per_pass=10, target_x=4.0)
    s.add_request(fresh("run", 3, max_tokens=50), 0.0)
    drive(s, 3)  # pass time 0.5 s (drive's postprocess)
    s.add_request(fresh("late", 60, arrival_time=0.0), 3.0)  # slack 1 s: 6 passes (3 s)
    s.add_request(fresh("soon", 30, arrival_time=2.5), 3.0)  # 3 passes in a slack of 3.5
    s.add_request(fresh("later", 20, arrival_time=3.0), 3.0)  # 2 in 4: more laxity
    (plan,) = drive(s, 1, t0=3.0)
    assert [c[0] for c in plan.prefill_chunks] == ["soon", "late"]
    assert plan.prefill_chunks[1] == ("late", 0, 2)  # the oldest's floor (10 // 4)


def test_with_nobody_decoding_the_first_prompt_by_risk_is_prefilled_whole() -> None:
    # No decode step to stall; and the engine runs the model only for batch members.
    s = make_scheduler(4, max_prefill_tokens_per_pass=10)
    s.add_request(fresh("a", 25), 0.0)
    s.add_request(fresh("b", 30), 0.0)
    plans = drive(s, 2)
    assert plans[0].prefill_chunks == (("a", 0, 25),) and plans[0].batch_ids == ("a",)
    assert plans[1].prefill_chunks == (("b", 0, 10),) and plans[1].batch_ids == ("a",)


def test_with_nobody_decoding_a_short_prompt_is_not_held_behind_a_long_one() -> None:
    s = make_scheduler(4, max_prefill_tokens_per_pass=8)
    s.add_request(fresh("long", 40), 0.0)
    s.add_request(fresh("short", 5), 0.0)
    (plan,) = drive(s, 1)
    # The short one whole (the pass needs a batch member), the oldest the rest.
    assert plan.prefill_chunks == (("short", 0, 5), ("long", 0, 3))
    assert plan.batch_ids == ("short",)


def test_running_requests_decode_every_pass_while_a_long_prompt_prefills() -> None:
    s = make_scheduler(4, max_prefill_tokens_per_pass=8)
    s.add_request(fresh("run", 4, max_tokens=50), 0.0)
    drive(s, 1)
    s.add_request(fresh("long", 40), 1.0)
    plans = drive(s, 5, t0=1.0)
    assert all("run" in p.batch_ids for p in plans)
    assert [p.batch_ids for p in plans[:4]] == [("run",)] * 4
    assert plans[4].prefill_ids == ("long",) and plans[4].prefill_chunks == (("long", 32, 40),)
    stats = s.make_stats(6.0)
    assert stats.active == 2 and stats.residents == 2
    assert stats.steps == 6 and stats.batch_sum == 7  # mid-prefill passes count "run" only


def test_mid_prefill_holds_a_batch_position() -> None:
    s = make_scheduler(2, max_prefill_tokens_per_pass=4)
    for name in "abc":
        s.add_request(fresh(name, 9), 0.0)
    plan = drive(s, 1)[0]
    assert plan.admitted_ids == ("a", "b")  # c waits: B = 2 positions are taken
    assert plan.batch_ids == ("a",) and s.prefilling_ids() == ("b",)
    assert s.num_active == 1 and s.num_waiting == 1 and s.num_residents == 2


def test_mid_prefill_request_is_never_a_pause_victim() -> None:
    s = make_scheduler(1, MODES[1], max_prefill_tokens_per_pass=4)
    s.add_request(fresh("long", 30, max_tokens=3), 0.0)
    plans = drive(s, 8)
    assert all(p.paused_ids == () for p in plans)
    assert [p.prefill_chunks[0][2] for p in plans if p.prefill_chunks][-1] == 30


def test_abort_mid_prefill_frees_its_position_and_blocks() -> None:
    s = make_scheduler(2, max_prefill_tokens_per_pass=4, kv_budget=KVBudget(16, 4))
    s.add_request(fresh("run", 2, max_tokens=30), 0.0)
    s.add_request(fresh("a", 20), 0.0)
    s.add_request(fresh("b", 3), 0.0)
    drive(s, 2)
    assert s.prefilling_ids() == ("a",) and s.num_waiting == 1
    used = s.kv.num_used
    s.abort("a")
    plans = drive(s, 1, t0=2.0)
    assert plans[0].finished_ids == ("a",) and plans[0].admitted_ids == ("b",)
    assert s.kv.num_used == used - 7 + 2  # a's 7 blocks freed, b's 2 reserved
    assert plans[0].prefill_chunks == (("b", 0, 3),) and plans[0].batch_ids == ("run", "b")


def test_pulled_and_resumed_requests_need_no_chunk() -> None:
    s = make_scheduler(4, max_prefill_tokens_per_pass=4)
    s.add_request(GenRequest("pulled", prompt_len=100, max_tokens=4, arrival_time=0.0), 0.0)
    plan = drive(s, 1)[0]
    assert plan.batch_ids == ("pulled",) and plan.prefill_chunks == () and plan.prefill_ids == ()


def test_equal_inputs_give_equal_plans_and_digests() -> None:
    def run() -> list[str]:
        s = make_scheduler(3, max_prefill_tokens_per_pass=6)
        for i, n in enumerate((13, 2, 7, 20)):
            s.add_request(fresh(f"r{i}", n), 0.0)
        return [p.digest() for p in drive(s, 6)]

    assert run() == run()


def test_default_is_whole_prefill() -> None:
    s = make_scheduler(4)
    s.add_request(fresh("a", 2000), 0.0)
    plan = drive(s, 1)[0]
    assert plan.prefill_ids == ("a",) and plan.batch_ids == ("a",) and plan.prefill_chunks == ()


@pytest.mark.parametrize("budget", [0, -1, True, 2.5])
def test_bad_budget_refused(budget: object) -> None:
    with pytest.raises(ValueError, match="max_prefill_tokens_per_pass"):
        make_scheduler(2, max_prefill_tokens_per_pass=budget)


MODES: list[dict[str, object]] = [
    {},
    {"tpot_budget": 0.5, "resident_headroom": 4, "paused_cap": 3},
    {"target_output_tps": 20.0, "resident_headroom": 4, "paused_cap": 3},
]


def check_invariants(s: GenScheduler) -> None:
    """docs/design.md#capacity with chunked prefill: a mid-prefill resident holds a
    batch position and its blocks; it is neither active nor paused."""
    prefilling = s.prefilling_ids()
    assert s.num_active + len(prefilling) <= s.max_batch_size
    assert s.num_residents == s.num_active + s.num_paused + len(prefilling)
    assert s.slots.num_used == s.num_residents
    members = [*s.active_ids(), *prefilling, *(r.request_id for r in s.pausing)]
    held = [b for i in members for b in s.get_request(i).blocks]
    assert len(held) == len(set(held)) == s.kv.num_used
    assert not set(prefilling) & set(s.active_ids())


@pytest.mark.parametrize("mode", MODES, ids=["off", "tpot_budget", "target_output_tps"])
def test_invariants_under_load_in_every_mode(mode: dict[str, object]) -> None:
    s = make_scheduler(3, mode, target_x=0.4, max_prefill_tokens_per_pass=16,
                       kv_budget=KVBudget(40, 8))  # fmt: skip
    requests = [
        GenRequest(f"r{i}", 5 + (i * 13) % 60, 5 + (i * 7) % 20, arrival_time=0.1 * i,
                   num_output_tokens=0)
        for i in range(40)
    ]  # fmt: skip
    now, arrived, passes = 0.0, 0, 0
    while arrived < len(requests) or s.num_residents or s.num_waiting:
        while arrived < len(requests) and (requests[arrived].arrival_time or 0.0) <= now:
            s.add_request(requests[arrived], now)
            arrived += 1
        plan = s.step(now)
        total = sum(end - start for _, start, end in plan.prefill_chunks)
        # Over the budget only when nobody decodes: one prompt, whole, the only member.
        assert total <= 16 or (len(plan.batch_ids) == 1 and plan.batch_ids == plan.prefill_ids)
        assert not set(plan.paused_ids) & {rid for rid, _, _ in plan.prefill_chunks}
        s.postprocess(plan, now + 0.05)
        check_invariants(s)
        now += 0.05
        passes += 1
        assert now < 300, "the pool did not drain"
    for request in requests:
        assert request.num_output_tokens >= 1 and request.first_token_time is not None
