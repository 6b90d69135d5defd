"""The paged KV cache's blocks: the budget, and the pool that hands them out
(docs/design.md#kv-blocks).

A worker's KV memory is ``num_blocks`` blocks of ``block_size`` tokens, sized from bytes
at start. A block that holds no cached prefix (a *plain* block) has one holder, the
request it was allocated to. With prefix caching a full block is also known by the hash
of the tokens it holds and every token before them (:mod:`genpool_core.block_hash`), so
a later request whose prompt starts the same way holds the same block instead of
computing it again: cached blocks lie in runs whose holders are counted per run
(:mod:`genpool_core.kv_index`). A block nobody holds is free; a free block that still
holds a cached prefix stays findable until its memory is needed: reuse takes
never-cached free blocks first, then cached ones, least recently freed first (LRU,
:mod:`genpool_core.kv_lru`). A held block is never reused, so evicting never touches a
resident (a paused one included).

Every rank runs the same calls in the same order, so every block id is the same on every
rank; the plan carries each admission's table. What is stored and evicted is recorded
as :class:`KVEvent` values for the worker's KV event publisher.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from genpool_core.block_hash import BlockHash
from genpool_core.kv_index import CachedRun, Held, PrefixHit, PrefixIndex
from genpool_core.kv_lru import FreedRuns


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
    """Block ids ``0 .. num_blocks - 1``; ``num_blocks`` is the dummy (padding) block,
    never handed out. Check first (``can_allocate``), then mutate.

    The scheduling pass moves a table of ~100 blocks at every admission and release, so
    nothing here costs a Python step per block: plain blocks move as slices of the free
    stack, cached ones as runs (a hold, a release and an eviction are per run). A holder
    holds plain blocks (``allocate``, ``free``) and runs (``hold`` a hit, ``cache`` what
    it wrote, ``release`` them). ``is_checked`` also keeps the plain blocks in use, so
    that a free of a block nobody holds, or listed twice, is refused (tests, debugging);
    unchecked, the scheduler's calls are trusted.
    """

    def __init__(self, budget: KVBudget, *, is_checked: bool = True,
                 is_recording: bool = True) -> None:  # fmt: skip
        """``is_recording``: keep :class:`KVEvent` values for a publisher (off, nobody
        reads them: eviction then reads no hash)."""
        self.budget = budget
        n = budget.num_blocks
        self._plain = list(range(n - 1, -1, -1))  # free, not cached: popped from the end
        self._freed = FreedRuns()  # free but cached: oldest first (the LRU)
        self._held: set[int] | None = set() if is_checked else None  # plain blocks in use
        self._index = PrefixIndex()  # what is findable
        self._runs: set[CachedRun] = set()  # every run with blocks (num_holders)
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
        """Blocks that hold a findable prefix, held or not."""
        return self._index.num_cached

    @property
    def num_lru_entries(self) -> int:
        """Entries in the LRU's queue, dead ones included (tests)."""
        return self._freed.num_entries

    def can_allocate(self, num_blocks: int) -> bool:
        return 0 <= num_blocks <= self.num_free

    def allocate(self, num_blocks: int) -> list[int]:
        """``num_blocks`` free blocks, plain and held once now: never-cached ones first,
        then the least recently freed cached ones (evicted: their hashes are forgotten)."""
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
        """``count`` free cached blocks, each run's taken from its end: plain from now."""
        taken: list[int] = []
        removed: list[BlockHash] = []
        for run, num_taken in self._freed.evict(count):
            cut = len(run.blocks) - num_taken
            taken += run.blocks[cut:]
            if self.is_recording and run.key is not None:
                removed += run.hashes[cut:]
            del run.blocks[cut:], run.hashes[cut:]
            self._index.trimmed(run, num_taken)
            if not run.blocks:
                self._runs.discard(run)
        self.num_forgets += 1
        if removed:
            self.events.append(BlockRemoved(tuple(removed)))
        return taken

    def free(self, blocks: Sequence[int]) -> None:
        """Give plain ``blocks`` back (checked: any not held, or listed twice, refuses the
        whole call)."""
        held = self._held
        if held is not None:
            if len(set(blocks)) != len(blocks) or not held.issuperset(blocks):
                raise ValueError(f"KV blocks {sorted(blocks)} are not all held: not allocated")
            held.difference_update(blocks)
        self._plain.extend(reversed(blocks))

    def lookup(self, hashes: Sequence[BlockHash], limit: int | None = None) -> PrefixHit:
        """The cached blocks of the longest run of ``hashes`` (a chain; at most ``limit``
        of them) from the first."""
        return self._index.lookup(hashes, limit)

    def hold(self, hit: PrefixHit) -> list[Held]:
        """Hold a hit's blocks (a free one leaves the LRU); what to ``release`` later."""
        freed = self._freed
        for run, num_blocks in hit.runs:
            before = run.num_free
            run.hold(num_blocks)
            freed.held(run, before)
        return list(hit.runs)

    def release(self, runs: Sequence[Held]) -> None:
        """Let go of runs once each (``hold`` and ``cache`` give them), last first: a
        run's blocks nobody holds any more are free and stay findable."""
        freed = self._freed
        for run, num_blocks in reversed(runs):
            before = run.num_free
            run.let_go(num_blocks)
            freed.freed(run, before)

    @staticmethod
    def num_evictable(hit: PrefixHit) -> int:
        """How many of a hit's blocks are free now: holding them takes free blocks."""
        return sum(max(0, num_blocks - run.max_held) for run, num_blocks in hit.runs)

    def cache(self, request_id: str, first_block: int, blocks: Sequence[int],
              hashes: Sequence[BlockHash], parent: BlockHash | None) -> Held | None:  # fmt: skip
        """Make held, fully written, plain ``blocks`` findable by ``hashes`` (aligned,
        consecutive links of one chain): one run, held whole by the caller, who no longer
        holds them as plain blocks. None, and the blocks stay plain, when there are none or
        another run holds the first hash already (first come keeps the chain, and a run
        nobody could find would only hold memory the LRU should hand out first)."""
        held = self._held
        if held is not None and not held.issuperset(blocks):
            raise ValueError(f"KV blocks {sorted(blocks)} are not all plain and held")
        run = CachedRun(hashes[0], list(hashes), list(blocks)) if blocks else None
        if run is None or not self._index.add(run):
            return None
        run.hold(len(blocks))
        self._runs.add(run)
        if held is not None:
            held.difference_update(blocks)
        if self.is_recording:
            self.events.append(BlockStored(request_id, first_block, tuple(hashes), parent))
        return run, len(blocks)

    def uncache(self, runs: Iterable[Held]) -> None:
        """Forget what ``runs`` hold (their KV is not what the hash says: a failed
        prefill); they stay held, and when their holders let go they join the LRU like
        cached ones, holding nothing findable."""
        removed: list[BlockHash] = []
        for run, _ in runs:
            removed += self._index.forget(run)
        self.num_forgets += 1
        if removed and self.is_recording:
            self.events.append(BlockRemoved(tuple(removed)))

    def clear_cache(self) -> None:
        """Forget every cached prefix (held blocks stay held); free cached blocks are
        plain again."""
        for run, num_taken in self._freed.drain():
            cut = len(run.blocks) - num_taken
            self._plain += run.blocks[cut:]
            del run.blocks[cut:], run.hashes[cut:]
            if not run.blocks:
                self._runs.discard(run)
        self._index.clear()
        self.num_forgets += 1
        if self.is_recording:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def num_holders(self, block: int) -> int:
        """How many hold ``block`` (a scan of every run, and for unchecked pools of the
        free list: slow, for tests)."""
        for run in self._runs:
            if block in run.blocks:
                return run.num_holders(run.blocks.index(block))
        if self._held is not None:
            return 1 if block in self._held else 0
        return 0 if block in self._plain or block == self.dummy_block else 1

    @staticmethod
    def num_held_only_by(holds: Iterable[Held]) -> int:
        """Blocks of runs that only ``holds`` hold (one per holder): what letting those
        holders go would free."""
        by_run: dict[CachedRun, list[int]] = {}
        for run, num_blocks in holds:
            by_run.setdefault(run, []).append(num_blocks)
        return sum(run.num_held_only(lengths) for run, lengths in by_run.items())
