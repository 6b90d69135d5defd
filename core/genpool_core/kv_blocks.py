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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from genpool_core.block_hash import BlockHash
from genpool_core.kv_index import PrefixIndex, values
from genpool_core.kv_lru import FreedOrder


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

    The scheduling pass moves a table of ~100 blocks at every admission and release, so
    the common cases cost next to nothing per block. A *plain* block (not cached since it
    was allocated) has exactly one holder, and nothing records it: allocation and release
    are slices of the free stack. Only a cached block can be shared (a prefix hit finds
    only those), so a block's holder count (``_refs``, a list indexed by block id: far
    smaller in the CPU's caches than a dict) is kept from the moment it is cached; 0 there
    means plain. A free cached block waits in the LRU (:mod:`genpool_core.kv_lru`).
    ``is_checked`` also keeps the plain blocks in use, so that a free of a block nobody
    holds, or listed twice, is refused (tests, debugging); unchecked, the scheduler's
    calls are trusted.
    """

    def __init__(self, budget: KVBudget, *, is_checked: bool = True,
                 is_recording: bool = True) -> None:  # fmt: skip
        """``is_recording``: keep :class:`KVEvent` values for a publisher (off, nobody
        reads them: eviction then reads no hash)."""
        self.budget = budget
        n = budget.num_blocks
        # Per block id: > 0, the holders of a cached block; 0, a plain block (held once,
        # or free); < 0, a free cached block in the LRU (kv_lru: its entry's tick).
        self._refs = [0] * (n + 1)
        self._plain = list(range(n - 1, -1, -1))  # free, not cached: popped from the end
        self._freed = FreedOrder(self._refs)  # free but cached: oldest first (the LRU)
        self._held: set[int] | None = set() if is_checked else None  # plain blocks in use
        self._has_cached = False  # nothing ever cached: every block is plain
        self._index = PrefixIndex(n)  # what is findable, by which hashes
        self.events: list[KVEvent] = []  # since the last ``take_events``
        self.is_recording = is_recording
        # Bumped whenever a cached block stops holding what it held (evicted, uncached,
        # cleared): a lookup made before is stale.
        self.num_forgets = 0

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
        return len(self._plain) + self._freed.num_queued

    @property
    def num_used(self) -> int:
        return self.budget.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks that hold a cached prefix, held or not."""
        return self._index.num_cached

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
        taken = self._freed.pop_oldest(count)
        self.num_forgets += 1
        if self.is_recording:
            self.events.append(BlockRemoved(tuple(self._index.forget(taken))))
        else:
            self._index.drop(taken)
        return taken

    def touch(self, blocks: Sequence[int]) -> None:
        """Hold cached blocks once more (a prefix hit): a free one leaves the LRU."""
        refs, freed = self._refs, self._freed
        for block in blocks:
            count = refs[block]
            if count < 0:
                freed.remove(block)  # held once now
            else:
                refs[block] = count + 1

    def free(self, blocks: Sequence[int]) -> None:
        """Let go of ``blocks`` once each (checked: any not held, or listed twice, refuses
        the whole call). A block nobody holds any more is free; a cached one stays
        findable, and a sequence's last blocks are the first evicted (its prefix is the
        most shared)."""
        held = self._held
        if held is not None:
            self._check_held(blocks, held)
        if not self._has_cached:  # every block plain: one bulk move
            self._plain.extend(reversed(blocks))
            return
        if blocks and not self._free_in_layers(list(reversed(blocks))):
            self._free_one_by_one(blocks)

    def _free_in_layers(self, last_first: list[int]) -> bool:
        """The common shape of a table, freed with C-level reads and slices: last first,
        the plain blocks (count 0, its unregistered tail), then those it alone holds
        (count 1), then those others hold too (its prefix, counts only grow toward the
        first block). False, and nothing done, for any other shape."""
        refs = self._refs
        counts = values(refs, last_first)
        num_plain, num_last = counts.count(0), counts.count(1)
        num_alone = num_plain + num_last
        if (
            counts[:num_plain].count(0) != num_plain
            or counts[num_plain:num_alone].count(1) != num_last
        ):
            return False
        self._plain += last_first[:num_plain]
        for block in last_first[num_alone:]:
            refs[block] -= 1  # others hold it still
        if num_last:
            self._freed.push(last_first[num_plain:num_alone])
        return True

    def _free_one_by_one(self, blocks: Sequence[int]) -> None:
        """Any table: block by block."""
        refs, plain = self._refs, self._plain
        queued: list[int] = []  # cached ones nobody holds now: to the LRU, last first
        for block in reversed(blocks):
            count = refs[block]
            if count > 1:
                refs[block] = count - 1  # others hold it still
            elif count:  # its last holder (the LRU sets a queued block's count)
                queued.append(block)
            else:
                plain.append(block)
        if queued:
            self._freed.push(queued)

    def _check_held(self, blocks: Sequence[int], held: set[int]) -> None:
        """Every block is held (plain ones in ``held``, cached ones counted) and listed
        once; the plain ones leave ``held``."""
        refs = self._refs
        plain = {block for block in blocks if refs[block] <= 0}  # (< 0: free, cached)
        is_unique = len(set(blocks)) == len(blocks)
        if not is_unique or not plain <= held:
            raise ValueError(f"KV blocks {sorted(blocks)} are not all held: not allocated")
        held -= plain

    def lookup(self, hashes: Sequence[BlockHash], limit: int | None = None) -> list[int]:
        """The cached blocks of the longest run of ``hashes`` (a chain; at most ``limit``
        of them) from the first."""
        return self._index.lookup(hashes, limit)

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (cached ones) are free now: a hit on one takes a free
        block."""
        if not blocks:
            return 0
        counts = values(self._refs, blocks)
        if min(counts) >= 0:  # the common case: all held (a shared prefix)
            return 0
        return [count < 0 for count in counts].count(True)

    def cache(self, request_id: str, first_block: int, blocks: Sequence[int],
              hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:  # fmt: skip
        """Make held, fully written, plain ``blocks`` findable by ``hashes`` (aligned,
        consecutive links of one chain). When another block holds the first hash already,
        none are (first come keeps it; :mod:`genpool_core.kv_index`)."""
        held = self._held
        if held is not None and not held.issuperset(blocks):
            raise ValueError(f"KV blocks {sorted(blocks)} are not all plain and held")
        if not self._index.add_run(blocks, hashes):
            return
        refs = self._refs
        for block in blocks:
            refs[block] = 1  # held by its writer: counted from now on
        if held is not None:
            held.difference_update(blocks)
        self._has_cached = True
        if self.is_recording:
            self.events.append(BlockStored(request_id, first_block, tuple(hashes), parent))

    def uncache(self, blocks: Iterable[int]) -> None:
        """Forget what ``blocks`` hold (their KV is not what the hash says: a failed
        prefill); they stay held and counted, and when their holders let go they join
        the LRU like cached ones, holding nothing findable (a failed prefill is rare: the
        release path reads holder counts only, never hashes)."""
        removed = self._index.forget(blocks)
        self.num_forgets += 1
        if removed and self.is_recording:
            self.events.append(BlockRemoved(tuple(removed)))

    def clear_cache(self) -> None:
        """Forget every cached prefix (held blocks stay held)."""
        self._plain.extend(self._freed.drain())
        self._index.clear()
        self.num_forgets += 1
        if self.is_recording:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def num_holders(self, block: int) -> int:
        """How many hold ``block`` (unchecked pools look a plain one up in the free list:
        slow, for tests)."""
        if self._refs[block]:
            return max(self._refs[block], 0)
        if self._held is not None:
            return 1 if block in self._held else 0
        return 0 if block in self._plain else 1
