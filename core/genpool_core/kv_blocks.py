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

from genpool_core.block_hash import NO_HASH, BlockHash
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

    def __init__(self, budget: KVBudget, *, is_checked: bool = True) -> None:
        self.budget = budget
        n = budget.num_blocks
        self._refs = [0] * (n + 1)  # holders of each cached block; 0: plain or free
        self._plain = list(range(n - 1, -1, -1))  # free, not cached: popped from the end
        self._freed = FreedOrder(n)  # free but cached: oldest first (the LRU)
        self._held: set[int] | None = set() if is_checked else None  # plain blocks in use
        self._has_cached = False  # nothing ever cached: every block is plain
        # What each block holds (NO_HASH: nothing findable), and each hash's block. An
        # entry of ``_cached`` is live only while its block still holds that hash: an
        # evicted block's entry is left to go stale (one list write per block instead of
        # two dict deletions; the pass evicts ~50 blocks an admission), and the dict is
        # rebuilt from the list when stale entries could outnumber live ones.
        self._hash_of = [NO_HASH] * (n + 1)
        self._cached: dict[BlockHash, int] = {}
        self._num_cached = 0
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
        return len(self._plain) + len(self._freed)

    @property
    def num_used(self) -> int:
        return self.budget.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks that hold a cached prefix, held or not."""
        return self._num_cached

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
        hash_of = self._hash_of
        removed = [hash_of[block] for block in taken]
        for block in taken:
            hash_of[block] = NO_HASH
        self._num_cached -= count
        self.events.append(BlockRemoved(tuple(removed)))
        return taken

    def touch(self, blocks: Sequence[int]) -> None:
        """Hold cached blocks once more (a prefix hit): a free one leaves the LRU."""
        refs, freed = self._refs, self._freed
        for block in blocks:
            count = refs[block]
            if not count:
                freed.remove(block)
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
        refs, hash_of = self._refs, self._hash_of
        plain: list[int] = []
        queued: list[int] = []
        for block in reversed(blocks):
            count = refs[block]
            if count > 1:
                refs[block] = count - 1  # others hold it still
            elif count == 0 or not hash_of[block]:  # plain, or cached once, forgotten since
                refs[block] = 0
                plain.append(block)
            else:
                refs[block] = 0
                queued.append(block)
        self._plain.extend(plain)
        if queued:
            self._freed.push(queued)

    def _check_held(self, blocks: Sequence[int], held: set[int]) -> None:
        """Every block is held (plain ones in ``held``, cached ones counted) and listed
        once; the plain ones leave ``held``."""
        refs = self._refs
        plain = {block for block in blocks if not refs[block]}
        is_unique = len(set(blocks)) == len(blocks)
        if not is_unique or not plain <= held:
            raise ValueError(f"KV blocks {sorted(blocks)} are not all held: not allocated")
        held -= plain

    def lookup(self, hashes: Iterable[BlockHash]) -> list[int]:
        """The cached blocks of the longest run of ``hashes`` from the first."""
        cached, hash_of = self._cached, self._hash_of
        found: list[int] = []
        for block_hash in hashes:  # (cached_block, inlined: a call per block costs)
            block = cached.get(block_hash)
            if block is None or hash_of[block] != block_hash:
                break
            found.append(block)
        return found

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (cached ones) are free now: a hit on one takes a free
        block."""
        refs = self._refs
        return [refs[block] for block in blocks].count(0)

    def cache(self, request_id: str, first_block: int, blocks: Sequence[int],
              hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:  # fmt: skip
        """Make held, fully written ``blocks`` findable by ``hashes`` (aligned). A hash
        another block already holds stays with that block (first come keeps it), and the
        chain stops there (it continues from a block that is not this one's)."""
        hash_of, cached, refs, held = self._hash_of, self._cached, self._refs, self._held
        count = 0
        for block, block_hash in zip(blocks, hashes, strict=True):
            other = cached.get(block_hash)
            if hash_of[block] or (other is not None and hash_of[other] == block_hash):
                break
            hash_of[block] = block_hash
            cached[block_hash] = block
            refs[block] = 1  # held by its writer: counted from now on
            count += 1
        if held is not None:
            held.difference_update(blocks[:count])
        self._has_cached = self._has_cached or count > 0
        self._num_cached += count
        if len(cached) > 2 * len(hash_of):
            self._cached = {h: block for block, h in enumerate(hash_of) if h}
        if count:
            self.events.append(BlockStored(request_id, first_block, tuple(hashes[:count]), parent))

    def uncache(self, blocks: Iterable[int]) -> None:
        """Forget what ``blocks`` hold (their KV is not what the hash says: a failed
        prefill); they stay held, and become plain and free when their holders let go."""
        hash_of, removed = self._hash_of, []
        for block in blocks:
            block_hash = hash_of[block]
            if block_hash:
                hash_of[block] = NO_HASH
                del self._cached[block_hash]  # live: it pointed to this block
                removed.append(block_hash)
        self._num_cached -= len(removed)
        if removed:
            self.events.append(BlockRemoved(tuple(removed)))

    def clear_cache(self) -> None:
        """Forget every cached prefix (held blocks stay held)."""
        self._plain.extend(self._freed.drain())
        self._cached.clear()
        self._hash_of = [NO_HASH] * len(self._hash_of)
        self._num_cached = 0
        self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def num_holders(self, block: int) -> int:
        """How many hold ``block`` (unchecked pools look a plain one up in the free list:
        slow, for tests)."""
        if self._refs[block] or block in self._freed:
            return self._refs[block]
        if self._held is not None:
            return 1 if block in self._held else 0
        return 0 if block in self._plain else 1

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block that holds ``block_hash`` now (None: not cached)."""
        block = self._cached.get(block_hash)
        return block if block is not None and self._hash_of[block] == block_hash else None
