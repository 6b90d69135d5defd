"""What the prefix cache can find: which block holds which block hash
(docs/design.md#prefix-caching).

A prompt is looked up as a chain from its first block, never one hash alone, so the
index keeps *runs*, not one entry per block: the blocks one ``add_run`` made findable
(consecutive links of a chain), keyed by the hash of the first. A lookup reads a run's
blocks in order against the chain (list reads) and consults the dict again only where a
run ends or diverges. Each block's hash is in a list by block id, so evicting a block
is a list write: a run whose block went stale ends there, and a run whose first block
goes stale leaves the dict at once (a flag per block says which blocks start a run), so
the dict holds live runs only. Registering a table of ~60 blocks is one dict insert
instead of 60 (each a cache miss in a dict of every cached block: most of the pass's
cost with prefix caching, bench/results/scheduler.json).

One hash, one block, at the run's start: a run whose first hash another block already
holds is not added (first come keeps it). Further along, a block may come to hold a
hash that an unreachable block also holds (a run broken by an eviction, whose later
blocks another request then recomputes): that stale copy is never found again and is
evicted like any free block, as vLLM's pool allows duplicate hashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from genpool_core.block_hash import NO_HASH, BlockHash


class PrefixIndex:
    def __init__(self, num_blocks: int) -> None:
        self._hash_of = [NO_HASH] * (num_blocks + 1)  # the dummy block's stays empty
        self._runs: dict[BlockHash, list[int]] = {}  # a run's first hash -> its blocks
        self._is_start = [False] * (num_blocks + 1)  # the block starts a run
        self.num_cached = 0  # blocks that hold a hash

    def hashes(self, blocks: Iterable[int]) -> list[BlockHash]:
        hash_of = self._hash_of
        return [hash_of[block] for block in blocks]

    def lookup(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The blocks holding the longest run of ``hashes`` from the first."""
        runs, hash_of = self._runs, self._hash_of
        found: list[int] = []
        num_hashes = len(hashes)
        while len(found) < num_hashes:
            start = len(found)
            run = runs.get(hashes[start])
            if run is None:
                break
            for block in run:
                k = len(found)
                if k == num_hashes or hash_of[block] != hashes[k]:
                    break
                found.append(block)
            if len(found) == start:  # (a listed run's first block holds its key: never
                break  # taken, but a lookup must end whatever the index holds)
        return found

    def add_run(self, blocks: Sequence[int], hashes: Sequence[BlockHash]) -> int:
        """Make ``blocks`` findable by ``hashes`` (aligned, one chain's consecutive links,
        none findable yet); how many were: all, or none when another block holds the
        first hash."""
        if not blocks or self.lookup(hashes[:1]):
            return 0
        hash_of = self._hash_of
        for block, block_hash in zip(blocks, hashes, strict=True):
            hash_of[block] = block_hash
        self._runs[hashes[0]] = list(blocks)
        self._is_start[blocks[0]] = True
        self.num_cached += len(blocks)
        return len(blocks)

    def forget(self, blocks: Iterable[int]) -> list[BlockHash]:
        """Blocks that hold nothing findable from now; the hashes they held."""
        hash_of, is_start = self._hash_of, self._is_start
        removed = []
        for block in blocks:
            block_hash = hash_of[block]
            if block_hash is not NO_HASH:  # (the small-int 0: no read of a hash object)
                hash_of[block] = NO_HASH
                removed.append(block_hash)
                if is_start[block]:
                    is_start[block] = False
                    del self._runs[block_hash]
        self.num_cached -= len(removed)
        return removed

    def clear(self) -> None:
        self._hash_of = [NO_HASH] * len(self._hash_of)
        self._runs.clear()
        self._is_start = [False] * len(self._is_start)
        self.num_cached = 0
