"""Prefix caching (docs/design.md#prefix-caching): the block pool's hashes, reference
counts and LRU eviction against a model, and the scheduler sharing a prompt's cached
blocks: a hit's blocks hold exactly the request's tokens, admission reserves only what
is not cached, prefill starts after the hit, and pausing and exhaustion lose nothing."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.block_hash import block_hashes, extend_hashes, hash_block
from genpool_core.kv_account import KVAccount
from genpool_core.kv_blocks import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVBudget,
)
from genpool_core.kv_index import Held
from genpool_core.kv_lru import MIN_COMPACT_ENTRIES
from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason, GenRequest, RequestStatus
from genpool_core.scheduler import GenScheduler
from tests.unit.support import check_invariants, make_scheduler

BS = 4  # tokens per block in these tests

# -- hashes ---------------------------------------------------------------------------


def test_a_block_hash_pins_every_token_before_it() -> None:
    tokens = list(range(40))
    hashes = block_hashes(tokens, BS)
    assert len(hashes) == 10 and len(set(hashes)) == 10
    assert block_hashes(tokens[:39], BS) == hashes[:9]  # only full blocks
    changed = [*tokens[:1], 999, *tokens[2:]]
    assert all(a != b for a, b in zip(block_hashes(changed, BS), hashes, strict=True))
    assert block_hashes(tokens, BS, b"other model")[0] != hashes[0]
    assert hashes[1] == hash_block(hashes[0], tokens[4:8])


@given(st.lists(st.integers(0, 50_000), max_size=60), st.integers(0, 60))
def test_hashes_extend_as_tokens_come(tokens: list[int], cut: int) -> None:
    grown = block_hashes(tokens[:cut], BS)
    extend_hashes(grown, tokens, BS)
    assert grown == block_hashes(tokens, BS)


# -- the pool against a model -----------------------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "cache", "hit"]), st.integers(0, 6),
              st.integers(0, 5)),
    max_size=80,
)  # fmt: skip


def _chain(family: int, length: int) -> list[int]:
    """A chain's first ``length`` hashes (family: which prompt)."""
    return [(1 << 63) | (family << 8) | i for i in range(length)]


@dataclass
class Holder:
    """What one holder holds: plain blocks, and runs (a hit, or what it cached)."""

    plain: list[int] = field(default_factory=list)
    runs: list[Held] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)  # the blocks its runs hold

    def give_back(self, pool: BlockPool) -> None:
        pool.release(self.runs)
        pool.free(self.plain)

    def cache(self, pool: BlockPool, chain: list[int]) -> None:
        """Its plain blocks become one run (what a prefill wrote), unless another run
        holds the chain's first hash: then they stay plain."""
        held = pool.cache("r", 0, self.plain, chain, None)
        if held is not None:
            self.runs.append(held)
            self.hit += self.plain
            self.plain = []


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_pool_matches_a_model_of_refcounts_and_lru_eviction(
    ops: list[tuple[str, int, int]],
) -> None:
    pool = BlockPool(KVBudget(12, BS))
    refs = [0] * 12
    content: dict[int, int] = {}  # block -> the hash its KV is (the model's truth)
    holders: list[Holder] = []
    fresh: list[Holder] = []  # allocated, not cached yet (what a prefill writes)
    stored: list[int] = []  # hashes the events say are cached (a block each)
    for op, n, pick in ops:
        if op == "alloc" and pool.can_allocate(n):
            blocks = pool.allocate(n)
            assert all(refs[b] == 0 for b in blocks), "a held block was handed out"
            for block in blocks:
                refs[block] = 1
                content.pop(block, None)  # reused: what it held is gone
            holders.append(Holder(plain=blocks))
            fresh.append(holders[-1])
        elif op == "free" and holders:
            holder = holders.pop(pick % len(holders))
            fresh = [other for other in fresh if other is not holder]
            holder.give_back(pool)
            for block in holder.plain + holder.hit:
                refs[block] -= 1
        elif op == "cache" and fresh:
            holder = fresh.pop(pick % len(fresh))
            blocks, chain = holder.plain, _chain(pick, len(holder.plain))
            was_found = bool(blocks) and bool(pool.lookup(chain[:1]).blocks)
            holder.cache(pool, chain)
            if blocks and not was_found:  # first come keeps a chain's start
                content.update(zip(blocks, chain, strict=True))
                assert pool.lookup(chain).blocks == blocks, "a chain just cached is found whole"
        elif op == "hit":
            chain = _chain(pick, 6)
            found = pool.lookup(chain)
            pairs = zip(found.blocks, chain[: len(found.blocks)], strict=True)
            assert all(content.get(b) == h for b, h in pairs), "a hit's KV is what it says"
            if found.blocks:
                num_evictable = pool.num_evictable(found)
                assert num_evictable == sum(1 for b in found.blocks if refs[b] == 0)
                holders.append(Holder(runs=pool.hold(found), hit=found.blocks))
                for block in found.blocks:
                    refs[block] += 1
        for event in pool.take_events():
            if isinstance(event, BlockStored):
                stored += event.hashes
            elif isinstance(event, BlockRemoved):
                for block_hash in event.hashes:
                    stored.remove(block_hash)  # ValueError: evicted twice, or never stored
        assert sorted(stored) == sorted(content.values()) and pool.num_cached == len(content)
        assert pool.num_free == sum(1 for r in refs if r == 0)
        assert all(pool.num_holders(b) == r for b, r in enumerate(refs))


def _cached(pool: BlockPool, chain: list[int]) -> Holder:
    holder = Holder(plain=pool.allocate(len(chain)))
    holder.cache(pool, chain)
    return holder


def test_eviction_takes_uncached_blocks_first_then_the_least_recently_freed() -> None:
    pool = BlockPool(KVBudget(6, BS))
    a, b = _cached(pool, [1, 2]), _cached(pool, [3, 4])
    a.give_back(pool)
    b.give_back(pool)
    assert pool.allocate(2) == [4, 5]  # never cached: first
    pool.take_events()
    assert pool.allocate(1) == [a.hit[1]]  # a's tail: freed first, its last block first
    assert pool.take_events() == [BlockRemoved((2,))]
    assert pool.lookup([1, 2]).blocks == [a.hit[0]]  # the prefix survives its tail


def test_a_hit_inside_a_run_holds_its_start_and_its_tail_is_evicted_first() -> None:
    pool = BlockPool(KVBudget(6, BS))
    writer = _cached(pool, _chain(1, 4))
    hit = pool.lookup([*_chain(1, 2), 99])  # the prompt leaves the run after 2 blocks
    assert hit.blocks == writer.hit[:2]
    reader = Holder(runs=pool.hold(hit), hit=hit.blocks)
    writer.give_back(pool)
    assert pool.num_free == 4 and pool.num_holders(writer.hit[1]) == 1
    assert sorted(pool.allocate(4)) == sorted([4, 5, *writer.hit[2:]])
    assert not pool.can_allocate(1), "a held block was counted free"
    assert pool.lookup(_chain(1, 4)).blocks == writer.hit[:2]
    reader.give_back(pool)
    assert pool.num_free == 2 and pool.lookup(_chain(1, 4)).blocks == writer.hit[:2]


def test_a_lookup_goes_on_from_inside_one_run_into_the_run_that_branched_there() -> None:
    pool = BlockPool(KVBudget(8, BS))
    system = _chain(1, 2)  # a shared system prompt of two blocks
    first = _cached(pool, [*system, 500])  # it and the first prompt's own block: one run
    hit = pool.lookup([*system, 600])  # the second prompt leaves that run after two blocks
    assert hit.blocks == first.hit[:2]
    second = Holder(runs=pool.hold(hit), hit=hit.blocks)
    own = Holder(plain=pool.allocate(1))
    own.cache(pool, [600])
    assert pool.lookup([*system, 600, 601]).blocks == [*first.hit[:2], *own.hit]
    assert pool.lookup([*system, 500]).blocks == first.hit
    for holder in (first, second, own):
        holder.give_back(pool)
    assert pool.num_free == 8 and pool.num_cached == 4


def test_blocks_held_only_by_some_holders_count_each_shared_block_once() -> None:
    pool = BlockPool(KVBudget(8, BS))
    writer = _cached(pool, _chain(1, 4))
    run, _ = writer.runs[0]
    reader = pool.hold(pool.lookup(_chain(1, 2)))  # the run's first two blocks
    assert pool.num_held_only_by(writer.runs) == 2  # its tail: the reader shares the rest
    assert pool.num_held_only_by(reader) == 0
    assert pool.num_held_only_by([*writer.runs, *reader]) == 4
    assert run.num_holders(0) == 2 and run.num_holders(3) == 1


def test_a_run_held_and_let_go_again_and_again_keeps_the_lru_queue_short() -> None:
    pool = BlockPool(KVBudget(8, BS))
    writer = _cached(pool, _chain(1, 4))
    writer.give_back(pool)
    for _ in range(1000):  # each release queues the run anew; each hold kills that entry
        pool.release(pool.hold(pool.lookup(_chain(1, 4))))
    assert pool.num_free == 8 and pool.num_lru_entries <= 2 * 1 + MIN_COMPACT_ENTRIES + 1
    assert sorted(pool.allocate(8)[4:]) == sorted(writer.hit)  # the cached ones last


def test_clearing_forgets_every_prefix_but_keeps_what_is_held() -> None:
    pool = BlockPool(KVBudget(4, BS))
    writer = _cached(pool, [7, 8])
    reader = Holder(runs=pool.hold(pool.lookup([7])), hit=writer.hit[:1])
    writer.give_back(pool)
    pool.clear_cache()
    assert pool.lookup([7]).blocks == [] and pool.num_free == 3
    assert pool.num_holders(writer.hit[0]) == 1 and pool.num_cached == 0
    assert pool.take_events()[-1] == AllBlocksCleared()
    reader.give_back(pool)
    assert pool.num_free == 4 and pool.allocate(4)  # the held block came back


def test_a_registration_whose_first_hash_is_cached_already_stays_plain() -> None:
    pool = BlockPool(KVBudget(6, BS))
    first = _cached(pool, [5, 6])
    second = _cached(pool, [5, 6])  # the same prompt, prefilled beside it
    assert second.runs == [] and len(second.plain) == 2
    assert pool.lookup([5, 6]).blocks == first.hit and pool.num_cached == 2
    assert [type(e) for e in pool.take_events()] == [BlockStored]
    first.give_back(pool)
    second.give_back(pool)
    assert pool.num_free == 6 and pool.num_holders(second.plain[0]) == 0
    assert sorted(pool.allocate(4)) == sorted([4, 5, *second.plain])  # plain ones first
    assert pool.take_events() == [] and pool.lookup([5, 6]).blocks == first.hit


# -- the scheduler sharing prompts -------------------------------------------------------


class Writer:
    """The runner's part: writes each scheduled prompt token into its block (block ->
    position -> token), checks a hit's blocks hold the request's own tokens."""

    def __init__(self) -> None:
        self.kv: dict[int, dict[int, int]] = {}
        self.tokens: dict[str, list[int]] = {}

    def run(self, scheduler: GenScheduler, plan: GenPlan) -> None:
        """In plan order: each admission's hit is checked before it (or any later one)
        is prefilled, whole prefills in admission order, then the chunks."""
        whole = set(plan.prefill_ids) - {rid for rid, _, _ in plan.prefill_chunks}
        for request_id, cached in zip(plan.admitted_ids, plan.admitted_cached_tokens,
                                      strict=True):  # fmt: skip
            request, tokens = scheduler.get_request(request_id), self.tokens[request_id]
            for position in range(cached):
                block = request.blocks[position // BS]
                assert self.kv[block][position % BS] == tokens[position], "a hit's KV"
            if request_id in whole:
                self.write(request, cached, request.prompt_len)
        for request_id, start, end in plan.prefill_chunks:
            self.write(scheduler.get_request(request_id), start, end)

    def write(self, request: GenRequest, first: int, last: int) -> None:
        for position in range(first, last):
            block = request.blocks[position // BS]
            self.kv.setdefault(block, {})[position % BS] = self.tokens[request.request_id][position]


def conversation(seed: int, turns: int, system: int) -> list[list[int]]:
    """Each turn's prompt: a shared system prompt, the history, a new message."""
    rng = random.Random(seed)
    history = [1000 + t for t in range(system)]
    prompts = []
    for _ in range(turns):
        history = history + [rng.randrange(50_000) for _ in range(rng.randint(1, 9))]
        prompts.append(list(history))
        history = history + [rng.randrange(50_000) for _ in range(rng.randint(1, 6))]
    return prompts


MODES = [
    {},
    {"tpot_budget": 0.5, "resident_headroom": 4, "paused_cap": 3},
    {"target_output_tps": 20.0, "resident_headroom": 4, "paused_cap": 3},
]


@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("mode", MODES, ids=["off", "tpot_budget", "target_output_tps"])
def test_conversations_share_their_history_and_exhaustion_loses_nothing(
    mode: dict[str, object], chunk: int | None
) -> None:
    scheduler = make_scheduler(2, mode, target_x=0.4, kv_budget=KVBudget(30, BS),
                               enable_prefix_caching=True,
                               max_prefill_tokens_per_pass=chunk)  # fmt: skip
    writer = Writer()
    prompts = [p for seed in range(6) for p in conversation(seed, 3, system=10)]
    requests = []
    for i, prompt in enumerate(prompts):
        request = GenRequest(f"r{i}", len(prompt), 3 + i % 4, arrival_time=0.05 * i,
                             first_token_time=0.05 * i, num_output_tokens=0,
                             block_hashes=block_hashes(prompt, BS))  # fmt: skip
        writer.tokens[request.request_id] = prompt
        requests.append(request)
    now, arrived, hit_tokens = 0.0, 0, 0
    while arrived < len(requests) or scheduler.num_residents or scheduler.num_waiting:
        while arrived < len(requests) and requests[arrived].arrival_time <= now:  # type: ignore[operator]
            scheduler.add_request(requests[arrived], now)
            arrived += 1
        plan = scheduler.step(now)
        writer.run(scheduler, plan)
        hit_tokens += sum(plan.admitted_cached_tokens)
        scheduler.postprocess(plan, now + 0.05)
        check_invariants(scheduler)
        now += 0.05
        assert now < 300, "the pool did not drain"
    assert hit_tokens > 0 and scheduler.kv.num_hit_tokens == hit_tokens
    assert scheduler.kv.num_queried_tokens == sum(len(p) for p in prompts)
    for request in requests:
        assert request.status is RequestStatus.FINISHED
        assert request.finish_reason is FinishReason.LENGTH and request.blocks == ()
    assert scheduler.kv.num_used == 0  # every held block came back; cached ones stay findable


def test_a_hit_reserves_only_what_is_not_cached_and_leaves_a_token_to_compute() -> None:
    scheduler = make_scheduler(4, kv_budget=KVBudget(8, BS), enable_prefix_caching=True)
    prompt = list(range(12))  # three full blocks
    first = GenRequest("a", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    scheduler.add_request(first, 0.0)
    plan = scheduler.step(0.0)
    assert plan.admitted_cached_tokens == (0,) and len(first.blocks) == 4
    scheduler.postprocess(plan, 0.1)
    twin = GenRequest("b", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    scheduler.add_request(twin, 0.1)
    before = scheduler.kv.num_used
    plan = scheduler.step(0.1)
    # two blocks shared (the third is the prompt's last: one token is always computed)
    assert plan.admitted_cached_tokens == (8,) and twin.blocks[:2] == first.blocks[:2]
    assert scheduler.kv.num_used == before + 2
    scheduler.postprocess(plan, 0.2)
    check_invariants(scheduler)


def test_a_paused_request_keeps_the_blocks_it_shares_pinned() -> None:
    scheduler = make_scheduler(1, {"target_output_tps": 5.0, "resident_headroom": 2,
                                   "paused_cap": 2}, target_x=0.1,
                               kv_budget=KVBudget(80, BS), enable_prefix_caching=True)  # fmt: skip
    prompt = list(range(9))
    old = GenRequest("old", 9, 200, arrival_time=0.0, first_token_time=0.0,
                     num_output_tokens=0, block_hashes=block_hashes(prompt, BS))  # fmt: skip
    scheduler.add_request(old, 0.0)
    now = 0.0
    for _ in range(5):
        plan = scheduler.step(now)
        scheduler.postprocess(plan, now + 0.01)
        now += 0.01
    new = GenRequest("new", 9, 3, arrival_time=now, first_token_time=now,
                     num_output_tokens=0, block_hashes=block_hashes(prompt, BS))  # fmt: skip
    scheduler.add_request(new, now)
    shared: tuple[int, ...] = ()
    num_paused_passes = 0
    while new.status is not RequestStatus.FINISHED:
        plan = scheduler.step(now)
        if "new" in plan.admitted_ids:
            shared = new.blocks[:2]
        if "old" in plan.paused_in_place_ids:
            num_paused_passes += 1
            pool = scheduler.kv.pool
            assert pool is not None and all(pool.num_holders(b) >= 1 for b in old.blocks)
        scheduler.postprocess(plan, now + 0.2)
        check_invariants(scheduler)
        now += 0.2
    assert num_paused_passes > 0  # old was paused for new, which shared its prefix
    assert new.num_cached_tokens == 8 and shared == old.blocks[:2]


def test_forgetting_a_failed_prefill_shares_none_of_it() -> None:
    scheduler = make_scheduler(4, kv_budget=KVBudget(12, BS), enable_prefix_caching=True)
    prompt = list(range(12))
    bad = GenRequest("bad", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    scheduler.add_request(bad, 0.0)
    plan = scheduler.step(0.0)
    scheduler.forget_kv("bad")
    scheduler.abort("bad")
    scheduler.postprocess(plan, 0.1)
    again = GenRequest("again", 12, 4, num_output_tokens=0,
                       block_hashes=block_hashes(prompt, BS))  # fmt: skip
    scheduler.add_request(again, 0.1)
    plan = scheduler.step(0.1)
    assert plan.admitted_cached_tokens == (0,)


def test_a_waiter_that_did_not_fit_looks_its_prefix_up_again_after_a_forget() -> None:
    """A lookup is kept between ``can_fit`` and ``reserve``; a head that did not fit looks
    again once anything was forgotten since (its hits may hold other KV by then)."""
    account = KVAccount(KVBudget(6, BS), is_caching=True)
    prompt = list(range(12))
    first = GenRequest("first", 12, 4, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    account.reserve(first)  # 4 blocks: 3 of prompt, 1 of output
    account.register_computed(first, 12)
    twin = GenRequest("twin", 12, 12, num_output_tokens=0, block_hashes=block_hashes(prompt, BS))
    assert not account.can_fit(twin)  # 2 hits + 4 new blocks, 2 free: waits
    account.forget(first)  # its prefill failed: nothing it wrote may be shared
    account.release(first)
    assert account.can_fit(twin)
    account.reserve(twin)
    assert twin.num_cached_tokens == 0, "a stale lookup shared a forgotten prefix"


def test_kv_events_are_kept_only_for_a_publisher() -> None:
    tables = []
    for is_recording in (True, False):
        pool = BlockPool(KVBudget(4, BS), is_recording=is_recording)
        _cached(pool, [7, 8]).give_back(pool)
        tables.append(pool.allocate(4))  # evicts both
        assert pool.num_cached == 0 and pool.lookup([7, 8]).blocks == []
        assert bool(pool.take_events()) == is_recording
    assert tables[0] == tables[1], "recording changed a decision"


def test_without_caching_nothing_is_looked_up_or_shared() -> None:
    scheduler = make_scheduler(4, kv_budget=KVBudget(12, BS))
    prompt = list(range(12))
    for name in ("a", "b"):
        scheduler.add_request(GenRequest(name, 12, 2, num_output_tokens=0,
                                         block_hashes=block_hashes(prompt, BS)), 0.0)  # fmt: skip
    plan = scheduler.step(0.0)
    assert plan.admitted_cached_tokens == (0, 0) and scheduler.kv.num_queried_tokens == 0


def _two_turns(scheduler: GenScheduler, first: dict[int, list[int]], stagger: bool) -> list[int]:
    """Each chat's first turn (all in one pass, or chat 0 a pass ahead), then its second
    (the first's prompt and reply, and a new message); the second turns' cached tokens.
    The reply's tokens are hashed as they come, as the worker does."""
    tokens: dict[str, list[int]] = {}
    requests: dict[str, GenRequest] = {}

    def submit(name: str, prompt: list[int], now: float) -> None:
        tokens[name] = list(prompt)
        requests[name] = GenRequest(name, len(prompt), 5, num_output_tokens=0,
                                    block_hashes=block_hashes(prompt, BS))  # fmt: skip
        scheduler.add_request(requests[name], now)

    for c in (0,) if stagger else first:
        submit(f"c{c}", first[c], 0.0)
    now, seconds = 0.0, []
    while scheduler.num_residents or scheduler.num_waiting or not seconds:
        plan = scheduler.step(now)
        scheduler.postprocess(plan, now + 0.05)
        for name in plan.batch_ids:
            tokens[name].append(7000 + len(tokens[name]))  # the token it made
            extend_hashes(requests[name].block_hashes, tokens[name], BS)
        now += 0.05
        if stagger and len(tokens) == 1:
            for c in (1, 2):
                submit(f"c{c}", first[c], now)
        finished = [n for n in tokens if n.startswith("c") and
                    requests[n].status is RequestStatus.FINISHED]  # fmt: skip
        for name in finished:
            reply = tokens.pop(name)
            submit("again-" + name, [*reply[:-1], 9000, 9001, 9002], now)
            seconds.append(name)
    return [requests[f"again-c{c}"].num_cached_tokens for c in first]


@pytest.mark.parametrize("stagger", [False, True], ids=["together", "one-ahead"])
def test_chats_prefilled_together_still_find_their_own_history_next_turn(stagger: bool) -> None:
    # A 10-token system prompt: the chats part inside a block, and inside a prefill
    # chunk (8 tokens a pass), which the first chat to get there registers.
    scheduler = make_scheduler(4, kv_budget=KVBudget(200, BS), enable_prefix_caching=True,
                               max_prefill_tokens_per_pass=8)  # fmt: skip
    system = list(range(1000, 1010))
    first = {c: [*system, *range(2000 + 100 * c, 2009 + 100 * c)] for c in range(3)}
    # Every block the first turn wrote: its 19 prompt tokens and 4 of its 5 replies.
    assert _two_turns(scheduler, first, stagger) == [(19 + 4) // BS * BS] * 3
    check_invariants(scheduler)
