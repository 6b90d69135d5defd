"""KV blocks (docs/design.md#kv-blocks): the pool, admission by memory, pausing that knows
memory, and a pool driven into block exhaustion in every mode losing nothing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.kv_blocks import BlockPool, KVBudget, reserved_tokens
from genpool_core.kv_index import Held
from genpool_core.request import FinishReason, GenRequest, RequestStatus
from genpool_core.statline import format_statline, make_statline, parse_statline
from tests.unit.support import check_invariants, keyed, make_scheduler, run_pass

# -- the pool -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=60))
def test_the_pool_never_hands_out_a_held_block_and_every_rank_agrees(
    ops: list[tuple[bool, int]],
) -> None:
    pool, twin = BlockPool(KVBudget(24, 16)), BlockPool(KVBudget(24, 16))
    free = set(range(24))
    held: list[list[int]] = []
    for is_allocate, n in ops:
        if is_allocate:
            assert pool.can_allocate(n) == (n <= len(free))
            if not pool.can_allocate(n):
                with pytest.raises(RuntimeError):
                    pool.allocate(n)
                continue
            blocks = pool.allocate(n)
            assert twin.allocate(n) == blocks  # the same calls give the same ids
            assert len(set(blocks)) == n and set(blocks) <= free
            free -= set(blocks)
            held.append(blocks)
        elif held:
            blocks = held.pop(n % len(held))
            pool.free(blocks)
            twin.free(blocks)
            free |= set(blocks)
        assert pool.num_free == len(free) and pool.num_used == 24 - len(free)


@dataclass
class Twins:
    """One holder's blocks in each of the two pools: plain ones, and runs."""

    plain: list[list[int]]
    runs: list[list[Held]]
    is_fresh: bool  # its plain blocks are not cached yet (what a prefill writes)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "cache", "hit"]), st.integers(0, 8)),
                max_size=60))  # fmt: skip
def test_an_unchecked_pool_decides_exactly_as_a_checked_one(ops: list[tuple[str, int]]) -> None:
    pools = BlockPool(KVBudget(20, 16)), BlockPool(KVBudget(20, 16), is_checked=False)
    holders: list[Twins] = []
    for op, n in ops:
        fresh = [holder for holder in holders if holder.is_fresh]
        if op == "alloc" and pools[0].can_allocate(n):
            tables = [pool.allocate(n) for pool in pools]
            assert tables[0] == tables[1]
            holders.append(Twins(tables, [[], []], is_fresh=True))
        elif op == "free" and holders:
            holder = holders.pop(n % len(holders))
            for pool, plain, runs in zip(pools, holder.plain, holder.runs, strict=True):
                pool.release(runs)
                pool.free(plain)
        elif op == "cache" and fresh:
            holder = fresh[n % len(fresh)]
            hashes = [(1 << 63) | (n << 8) | i for i in range(len(holder.plain[0]))]
            for i, pool in enumerate(pools):
                run = pool.cache("r", 0, holder.plain[i], hashes, None)
                if run is not None:  # (None: another run holds the first hash; still plain)
                    holder.runs[i].append(run)
                    holder.plain[i] = []
            holder.is_fresh = False
        elif op == "hit":
            hits = [pool.lookup([(1 << 63) | (n << 8)]) for pool in pools]
            assert hits[0].blocks == hits[1].blocks
            if hits[0].blocks:
                runs = [pool.hold(hit) for pool, hit in zip(pools, hits, strict=True)]
                holders.append(Twins([[], []], runs, is_fresh=False))
        checked, trusting = pools
        assert checked.take_events() == trusting.take_events()
        assert (checked.num_free, checked.num_cached) == (trusting.num_free, trusting.num_cached)
        assert all(checked.num_holders(b) == trusting.num_holders(b) for b in range(20))


def test_a_fresh_pool_hands_out_consecutive_ids_from_zero() -> None:
    pool = BlockPool(KVBudget(8, 16))
    assert pool.allocate(3) == [0, 1, 2] and pool.allocate(2) == [3, 4]


def test_the_pool_refuses_to_free_what_it_did_not_hand_out() -> None:
    pool = BlockPool(KVBudget(4, 8))
    blocks = pool.allocate(2)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([blocks[0], blocks[0]])
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([pool.dummy_block])
    assert pool.num_used == 2  # a refused free changes nothing
    pool.free(blocks)
    assert pool.num_free == 4


def test_a_budget_counts_blocks_of_whole_tokens() -> None:
    budget = KVBudget(10, 16)
    assert [budget.blocks_for(n) for n in (0, 1, 16, 17, 32)] == [1, 1, 1, 2, 2]
    assert KVBudget(3, 16).num_tokens == 48
    assert reserved_tokens(100, 28) == 128
    with pytest.raises(ValueError, match="num_blocks >= 1"):
        KVBudget(0, 16)


# -- the scheduler --------------------------------------------------------------------------


def test_a_head_whose_blocks_do_not_fit_waits_until_blocks_come_back() -> None:
    # 6 blocks of 16 tokens; each request reserves prompt 16 + 32 output = 3 blocks.
    scheduler = make_scheduler(4, kv_budget=KVBudget(6, 16))
    for i in range(3):
        scheduler.add_request(keyed(f"r{i}", 0.0, max_tokens=32), 0.0)
    plan = run_pass(scheduler, 0.0)
    assert plan.admitted_ids == ("r0", "r1")  # a free batch position, but no blocks for r2
    assert plan.admitted_blocks == ((0, 1, 2), (3, 4, 5))
    assert scheduler.num_waiting == 1 and scheduler.kv.num_used == 6
    scheduler.abort("r0")
    plan = run_pass(scheduler, 0.2)
    assert plan.finished_ids == ("r0",) and plan.admitted_ids == ("r2",)
    assert plan.admitted_blocks == ((0, 1, 2),)  # r0's blocks, lowest first
    check_invariants(scheduler)


def test_a_request_larger_than_the_whole_cache_is_refused_at_once() -> None:
    scheduler = make_scheduler(4, kv_budget=KVBudget(4, 16))
    with pytest.raises(ValueError, match="need 5 KV blocks of 16 tokens; the worker's KV cache"):
        scheduler.add_request(keyed("big", 0.0, max_tokens=64), 0.0)
    assert scheduler.num_waiting == 0


def _at_risk_pool(num_blocks: int) -> tuple[list[str], list[str]]:
    """B = 2 busy residents, an at-risk waiter; (paused ids, admitted ids) of the pass."""
    scheduler = make_scheduler(
        2,
        {"target_output_tps": 5.0, "resident_headroom": 2, "paused_cap": 2},
        target_x=1.0,
        kv_budget=KVBudget(num_blocks, 16),
    )
    for i in range(2):
        scheduler.add_request(keyed(f"r{i}", 0.0, max_tokens=200), 0.0)
    for k in range(8):
        run_pass(scheduler, k * 0.1)
    scheduler.add_request(keyed("late", 0.0, max_tokens=32), 0.9)
    plan = scheduler.step(2.0)
    check_invariants(scheduler)
    return list(plan.paused_ids), list(plan.admitted_ids)


def test_a_pause_admits_an_at_risk_waiter_only_if_its_blocks_fit() -> None:
    # Each resident holds 14 blocks (16 + 200 tokens), the waiter needs 3 (16 + 32).
    assert _at_risk_pool(31) == (["r0"], ["late"])
    assert _at_risk_pool(30) == ([], [])  # 2 blocks free, and a pause frees none


def test_stats_and_the_stat_line_carry_kv_use_and_its_paused_share() -> None:
    scheduler = make_scheduler(
        1,
        {"target_output_tps": 5.0, "resident_headroom": 1, "paused_cap": 1},
        target_x=1.0,
        kv_budget=KVBudget(40, 16),
    )
    scheduler.add_request(keyed("r0", 0.0, max_tokens=200), 0.0)
    for k in range(8):
        run_pass(scheduler, k * 0.1)
    scheduler.add_request(keyed("late", 0.0, max_tokens=32), 0.9)
    plan = run_pass(scheduler, 2.0)
    assert plan.paused_ids == ("r0",)
    stats = scheduler.make_stats(2.1)
    assert (stats.kv_blocks, stats.kv_blocks_used, stats.kv_blocks_paused) == (40, 17, 14)
    line = make_statline(stats, None)
    assert "kv=0.425 kv_paused=0.350" in format_statline(line)
    parsed = parse_statline(format_statline(line))
    assert parsed is not None and (parsed.kv_used, parsed.kv_paused) == (0.425, 0.35)


def test_without_a_budget_the_line_has_no_kv_fields() -> None:
    scheduler = make_scheduler(2)
    line = format_statline(make_statline(scheduler.make_stats(0.0), None))
    assert "kv=" not in line and "kv_paused=" not in line


MODES: list[dict[str, object]] = [
    {},
    {"tpot_budget": 0.5, "resident_headroom": 4, "paused_cap": 3},
    {"target_output_tps": 20.0, "resident_headroom": 4, "paused_cap": 3},
]


@pytest.mark.parametrize("mode", MODES, ids=["off", "tpot_budget", "target_output_tps"])
def test_block_exhaustion_in_every_mode_loses_nothing(mode: dict[str, object]) -> None:
    # 14 blocks of 8 tokens for requests of 3..7 blocks: memory binds, not only B + H.
    scheduler = make_scheduler(2, mode, target_x=0.4, kv_budget=KVBudget(14, 8))
    requests = [
        GenRequest(f"r{i}", 8 + i % 5, 10 + (i * 7) % 30, arrival_time=0.1 * i,
                   first_token_time=0.1 * i)
        for i in range(40)
    ]  # fmt: skip
    now, arrived, memory_bound_passes, paused = 0.0, 0, 0, 0
    while arrived < len(requests) or scheduler.num_residents or scheduler.num_waiting:
        while arrived < len(requests) and requests[arrived].arrival_time <= now:  # type: ignore[operator]
            scheduler.add_request(requests[arrived], now)
            arrived += 1
        plan = run_pass(scheduler, now, 0.05)
        check_invariants(scheduler)
        paused += len(plan.paused_ids)
        head = scheduler.queue.peek()
        is_blocked = head is not None and not scheduler.kv.can_fit(head)
        memory_bound_passes += is_blocked and scheduler.num_residents < 2 + 4
        now += 0.05
        assert now < 300, "the pool did not drain"
    assert memory_bound_passes > 10  # the run did exhaust the blocks
    if mode:
        assert paused > 0  # and pausing still happened where blocks allowed it
    for request in requests:
        assert request.status is RequestStatus.FINISHED
        assert request.finish_reason is FinishReason.LENGTH
        assert request.num_output_tokens == request.max_tokens
        assert request.blocks == ()
    assert scheduler.kv.num_used == 0
