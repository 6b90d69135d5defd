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

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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

    Two kinds of held block, so that a pool without sharing costs no Python loop per
    block: a *plain* block has one holder and has never been cached since it was
    allocated (a set, moved in bulk); a *shared* block was made findable (``cache``) and
    carries a reference count, kept until its last holder lets go. Only shared blocks are
    ever held more than once (a prefix hit finds only cached blocks).
    """

    def __init__(self, budget: KVBudget) -> None:
        self.budget = budget
        n = budget.num_blocks
        self._plain = list(range(n - 1, -1, -1))  # free, not cached: popped from the end
        self._held: set[int] = set()  # plain blocks in use (one holder each)
        self._refs: dict[int, int] = {}  # shared blocks (cached, or once cached): holders
        self._hashes: dict[int, BlockHash] = {}  # findable blocks: block -> hash
        self._cached: dict[BlockHash, int] = {}  # hash -> the block that holds it
        self._evictable: dict[int, None] = {}  # free but cached: oldest first (LRU)
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
        self._held.update(blocks)
        return blocks

    def _evict(self, count: int) -> list[int]:
        evictable, hashes, refs = self._evictable, self._hashes, self._refs
        taken = list(itertools.islice(evictable, count))  # the least recently freed
        removed = []
        for block in taken:
            del evictable[block], refs[block]
            block_hash = hashes.pop(block)
            del self._cached[block_hash]
            removed.append(block_hash)
        self.events.append(BlockRemoved(tuple(removed)))
        return taken

    def touch(self, blocks: Iterable[int]) -> None:
        """Hold cached blocks once more (a prefix hit): a free one leaves the LRU."""
        refs, evictable = self._refs, self._evictable
        for block in blocks:
            if refs[block] == 0:
                del evictable[block]
            refs[block] += 1

    def free(self, blocks: Sequence[int]) -> None:
        """Let go of ``blocks`` once each; any not held (or listed twice) refuses the whole
        call. A block nobody holds any more is free; a cached one stays findable, and the
        last blocks of a sequence are the first evicted (its prefix is the most shared)."""
        given = set(blocks)
        shared = given & self._refs.keys()
        plain = given - shared
        refs = self._refs
        if (len(given) != len(blocks) or not plain <= self._held
                or any(refs[block] == 0 for block in shared)):  # fmt: skip
            raise ValueError(f"KV blocks {sorted(blocks)} are not all held: not allocated")
        self._held -= plain
        if not shared:  # nothing was ever shared: one bulk move
            self._plain.extend(reversed(blocks))
            return
        for block in reversed(blocks):
            count = refs.get(block)
            if count is None:
                self._plain.append(block)
            elif count == 1:
                self._release_shared(block)
            else:
                refs[block] = count - 1

    def _release_shared(self, block: int) -> None:
        """A shared block's last holder let go: findable, it waits in the LRU; no longer
        findable (forgotten), it is plain and free again."""
        if block in self._hashes:
            self._refs[block] = 0
            self._evictable[block] = None
        else:
            del self._refs[block]
            self._plain.append(block)

    def lookup(self, hashes: Iterable[BlockHash]) -> list[int]:
        """The cached blocks of the longest run of ``hashes`` from the first."""
        found = []
        cached = self._cached
        for block_hash in hashes:
            block = cached.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """How many of ``blocks`` (cached ones) are free now: a hit on one takes a free
        block."""
        refs = self._refs
        return sum(1 for block in blocks if refs[block] == 0)

    def cache(self, request_id: str, first_block: int, blocks: Sequence[int],
              hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:  # fmt: skip
        """Make held, fully written ``blocks`` findable by ``hashes`` (aligned). A hash
        another block already holds stays with that block (first come keeps it), and the
        chain stops there."""
        stored: list[BlockHash] = []
        block_hashes, cached, refs, held = self._hashes, self._cached, self._refs, self._held
        for block, block_hash in zip(blocks, hashes, strict=True):
            if block in block_hashes or block_hash in cached:
                break  # the chain continues from a block that is not this one's
            if block in held:  # plain until now: one holder
                held.discard(block)
                refs[block] = 1
            block_hashes[block] = block_hash
            cached[block_hash] = block
            stored.append(block_hash)
        if stored:
            self.events.append(BlockStored(request_id, first_block, tuple(stored), parent))

    def uncache(self, blocks: Iterable[int]) -> None:
        """Forget what ``blocks`` hold (their KV is not what the hash says: a failed
        prefill); they stay held, counted as shared until their holders let go."""
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
        for block in self._evictable:
            del self._refs[block]
            self._plain.append(block)
        self._evictable.clear()
        self._cached.clear()
        self._hashes.clear()
        self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def num_holders(self, block: int) -> int:
        count = self._refs.get(block)
        if count is not None:
            return count
        return 1 if block in self._held else 0

    def cached_block(self, block_hash: BlockHash) -> int | None:
        return self._cached.get(block_hash)
