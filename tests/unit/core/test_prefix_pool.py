"""Prefix caching's block pool (docs/design.md#prefix-caching): block hashes, and cached
runs' holder counts, lookups, LRU eviction and KV events against a per-block model."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.block_hash import block_hashes, extend_hashes, hash_block
from genpool_core.kv_blocks import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVBudget,
)
from genpool_core.kv_index import Held
from genpool_core.kv_lru import MIN_COMPACT_ENTRIES

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


def test_kv_events_are_kept_only_for_a_publisher() -> None:
    tables = []
    for is_recording in (True, False):
        pool = BlockPool(KVBudget(4, BS), is_recording=is_recording)
        _cached(pool, [7, 8]).give_back(pool)
        tables.append(pool.allocate(4))  # evicts both
        assert pool.num_cached == 0 and pool.lookup([7, 8]).blocks == []
        assert bool(pool.take_events()) == is_recording
    assert tables[0] == tables[1], "recording changed a decision"
