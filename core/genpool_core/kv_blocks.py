"""The paged KV cache's blocks: the budget, and the pool that hands them out
(docs/design.md#kv-blocks).

A worker's KV memory is ``num_blocks`` blocks of ``block_size`` tokens, sized from bytes
at start. Each block has a reference count: the requests that hold it. With prefix
caching a full block is also known by the hash of the tokens it holds and every token
before them (:mod:`genpool_core.block_hash`), so a later request whose prompt starts
the same way holds the same block instead of computing it again. A block nobody holds
is free; a free block that still holds a cached prefix stays findable until its memory
is needed: reuse takes never-cached free blocks first, then cached ones, least recently
freed first (LRU). A held block is never reused, so evicting never touches a resident
(a paused one included).

Every rank runs the same calls in the same order, so every block id is the same on every
rank; the plan carries each admission's table. What is stored and evicted is recorded
as :class:`KVEvent` values for the worker's KV event publisher.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from genpool_core.block_hash import BlockHash


@dataclass(frozen=True, slots=True)
class KVBudget:
    """``num_blocks`` blocks of ``block_size`` tokens each."""

    num_blocks: int
    block_size: int

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(
                f"a KV budget needs num_blocks >= 1 and block_size >= 1, got "
                f"{self.num_blocks} and {self.block_size}"
            )

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens (at least one)."""
        return max(1, -(-num_tokens // self.block_size))


def reserved_tokens(prompt_len: int, max_tokens: int) -> int:
    """KV rows a request may write: its prompt and every output token it may produce."""
    return prompt_len + max_tokens


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks ``first_block`` .. ``first_block + len(hashes) - 1`` of ``request_id``'s
    tokens became cached under ``hashes`` (the worker adds their token ids)."""

    request_id: str
    first_block: int
    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None  # the hash of the block before the first; None: the first


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks evicted: their memory was reused."""

    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every cached block forgotten at once."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class BlockPool:
    """Reference-counted block ids ``0 .. num_blocks - 1``; ``num_blocks`` is the dummy
    (padding) block, never handed out. Check first (``can_allocate``), then mutate.

    Held blocks are of three kinds, each kept so that whole tables move by C-level set,
    dict and list operations, not a Python loop per block (the scheduling pass moves a
    table of ~100 blocks at every admission and release): a *plain* block has one holder
    and has not been cached since it was allocated; a *single* block is cached (or was)
    and has one holder; a *multi* block has two or more (only cached blocks are ever
    shared: a prefix hit finds only those) and carries its count. ``is_checked`` keeps the
    plain blocks in use too, so that a free of a block nobody holds is refused (tests,
    debugging); unchecked, the scheduler's calls are trusted.
    """

    def __init__(self, budget: KVBudget, *, is_checked: bool = True) -> None:
        self.budget = budget
        n = budget.num_blocks
        self._plain = list(range(n - 1, -1, -1))  # free, not cached: popped from the end
        self._held: set[int] | None = set() if is_checked else None  # plain blocks in use
        self._single: set[int] = set()  # cached (or once cached), one holder
        self._multi: dict[int, int] = {}  # two or more holders: how many
        self._hashes: dict[int, BlockHash] = {}  # findable blocks: block -> hash
        self._cached: dict[BlockHash, int] = {}  # hash -> the block that holds it
        self._evictable: dict[int, None] = {}  # free but cached: oldest first (LRU)
        self._num_holes = 0  # entries deleted from the LRU since it was last compacted
        self.events: list[KVEvent] = []  # since the last ``take_events``

    @property
    def num_blocks(self) -> int:
        return self.budget.num_blocks

    @property
    def block_size(self) -> int:
        return self.budget.block_size

    @property
    def dummy_block(self) -> int:
        """Scratch block for batch padding; never given to a request."""
        return self.budget.num_blocks

    @property
    def num_free(self) -> int:
        """Blocks nobody holds, cached ones included (they go when memory is needed)."""
        return len(self._plain) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.budget.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks that hold a cached prefix, held or not."""
        return len(self._cached)

    def can_allocate(self, num_blocks: int) -> bool:
        return 0 <= num_blocks <= self.num_free

    def allocate(self, num_blocks: int) -> list[int]:
        """``num_blocks`` free blocks, each now held once: never-cached ones first, then
        the least recently freed cached ones (evicted: their hashes are forgotten)."""
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"{num_blocks} KV blocks asked, {self.num_free} free")
        plain = self._plain
        take = min(num_blocks, len(plain))
        blocks = plain[len(plain) - take :]
        del plain[len(plain) - take :]
        blocks.reverse()
        if take < num_blocks:
            blocks += self._evict(num_blocks - take)
        if self._held is not None:
            self._held.update(blocks)
        return blocks

    def _evict(self, count: int) -> list[int]:
        """The ``count`` least recently freed cached blocks, forgotten: plain from now."""
        taken = list(itertools.islice(self._evictable, count))
        removed = [self._hashes[block] for block in taken]
        self._forget_lru(taken)
        _each(self._hashes.__delitem__, taken)
        _each(self._cached.__delitem__, removed)
        self.events.append(BlockRemoved(tuple(removed)))
        return taken

    def _forget_lru(self, blocks: Collection[int]) -> None:
        """Take ``blocks`` out of the LRU. A dict used as a queue keeps the holes its
        deleted entries leave until it is rebuilt, and iterating from the front walks them
        (the next eviction would cost as many steps as blocks evicted so far): rebuilt
        once the holes outnumber the entries, so an eviction stays proportional to it."""
        _each(self._evictable.__delitem__, blocks)
        self._num_holes += len(blocks)
        if self._num_holes > len(self._evictable):
            self._evictable = dict(self._evictable)
            self._num_holes = 0

    def touch(self, blocks: Sequence[int]) -> None:
        """Hold cached blocks once more (a prefix hit): a free one leaves the LRU."""
        hits = set(blocks)
        freed = hits & self._evictable.keys()
        singles = hits & self._single
        self._forget_lru(freed)
        self._single -= singles
        self._single |= freed
        multi = self._multi
        multi.update(dict.fromkeys(singles, 2))
        for block in hits - freed - singles:  # already held twice or more
            multi[block] += 1

    def free(self, blocks: Sequence[int]) -> None:
        """Let go of ``blocks`` once each (checked: any not held, or listed twice, refuses
        the whole call). A block nobody holds any more is free; a cached one stays
        findable, and a sequence's last blocks are the first evicted (its prefix is the
        most shared)."""
        if not self._single and not self._multi:  # nothing shared: one bulk move
            self._check_plain(blocks, set(blocks) if self._held is not None else set())
            self._plain.extend(reversed(blocks))
            return
        given = set(blocks)
        singles = given & self._single
        multis = given & self._multi.keys()
        plain = given - singles - multis
        self._check_plain(blocks, plain, given)
        if plain:
            self._plain.extend(b for b in reversed(blocks) if b in plain)
        if singles:
            self._release_singles([b for b in reversed(blocks) if b in singles], singles)
        multi = self._multi
        for block in multis:
            count = multi[block] - 1
            if count == 1:
                del multi[block]
                self._single.add(block)
            else:
                multi[block] = count

    def _check_plain(self, blocks: Sequence[int], plain: set[int],
                     given: set[int] | None = None) -> None:  # fmt: skip
        """Checked: the plain ones are held, and nothing is listed twice."""
        held = self._held
        if held is None:
            return
        unique = len(given if given is not None else plain) == len(blocks)
        if not unique or not plain <= held:
            raise ValueError(f"KV blocks {sorted(blocks)} are not all held: not allocated")
        held -= plain

    def _release_singles(self, ordered: list[int], singles: set[int]) -> None:
        """Their last holder let go: findable, they wait in the LRU (in ``ordered``'s
        order); forgotten (no hash), they are plain and free again."""
        self._single -= singles
        hashes = self._hashes
        if not hashes.keys() >= singles:  # (a view against a set: iterates the set only)
            self._plain.extend(b for b in ordered if b not in hashes)
            ordered = [b for b in ordered if b in hashes]
        self._evictable.update(dict.fromkeys(ordered))

    def lookup(self, hashes: Iterable[BlockHash]) -> list[int]:
        """The cached blocks of the longest run of ``hashes`` from the first."""
        cached = self._cached
        return list(map(cached.__getitem__, itertools.takewhile(cached.__contains__, hashes)))

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (cached ones) are free now: a hit on one takes a free
        block."""
        return len(self._evictable.keys() & blocks)

    def cache(self, request_id: str, first_block: int, blocks: Sequence[int],
              hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:  # fmt: skip
        """Make held, fully written ``blocks`` findable by ``hashes`` (aligned). A hash
        another block already holds stays with that block (first come keeps it), and the
        chain stops there."""
        if not blocks:
            return
        is_fresh = (
            self._cached.keys().isdisjoint(hashes)
            and self._hashes.keys().isdisjoint(blocks)
            and self._single.isdisjoint(blocks)
            and self._multi.keys().isdisjoint(blocks)
        )
        count = len(blocks) if is_fresh else self._fresh_run(blocks, hashes)
        if count == 0:
            return
        stored, cached_blocks = tuple(hashes[:count]), blocks[:count]
        self._hashes.update(zip(cached_blocks, stored, strict=True))
        self._cached.update(zip(stored, cached_blocks, strict=True))
        self._single.update(cached_blocks)  # plain until now: one holder
        if self._held is not None:
            self._held.difference_update(cached_blocks)
        self.events.append(BlockStored(request_id, first_block, stored, parent))

    def _fresh_run(self, blocks: Sequence[int], hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks can be cached: plain ones whose hash nobody holds."""
        count = 0
        for block, block_hash in zip(blocks, hashes, strict=True):
            tracked = block in self._single or block in self._multi or block in self._hashes
            if tracked or block_hash in self._cached:
                break  # the chain continues from a block that is not this one's
            count += 1
        return count

    def uncache(self, blocks: Iterable[int]) -> None:
        """Forget what ``blocks`` hold (their KV is not what the hash says: a failed
        prefill); they stay held, and become plain and free when their holders let go."""
        removed = []
        for block in blocks:
            block_hash = self._hashes.get(block)
            if block_hash is not None and self._cached.get(block_hash) == block:
                del self._cached[block_hash], self._hashes[block]
                removed.append(block_hash)
        if removed:
            self.events.append(BlockRemoved(tuple(removed)))

    def clear_cache(self) -> None:
        """Forget every cached prefix (held blocks stay held)."""
        self._plain.extend(self._evictable)
        self._evictable = {}
        self._num_holes = 0
        self._cached.clear()
        self._hashes.clear()
        self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def num_holders(self, block: int) -> int:
        """How many hold ``block`` (unchecked pools look a plain one up in the free list:
        slow, for tests)."""
        if block in self._single:
            return 1
        if block in self._multi:
            return self._multi[block]
        if block in self._evictable:
            return 0
        if self._held is not None:
            return 1 if block in self._held else 0
        return 0 if block in self._plain else 1

    def cached_block(self, block_hash: BlockHash) -> int | None:
        return self._cached.get(block_hash)


def _each(function: Callable[[Any], object], items: Iterable[Any]) -> None:
    """``function`` on every item, looped in C (a deque that keeps nothing)."""
    collections.deque(map(function, items), maxlen=0)
