"""What the prefix cache can find: which block holds which block hash
(docs/design.md#prefix-caching).

A prompt is looked up as a chain from its first block, never one hash alone, so the
index keeps *runs*, not one entry per block: the blocks one ``add_run`` made findable
(consecutive links of a chain), keyed by the hash of the first. Registering a table of
~60 blocks is one dict insert instead of 60 (each a cache miss in a dict of every
cached block). Each block's hash is in a list by block id: a lookup compares a run's
blocks' hashes with the chain in one C-level comparison (a block walk only where they
differ), and evicting a block is a list write, nothing more.

A run whose block was evicted ends there; a run whose *first* block was evicted is
stale: its key no longer names it. Stale runs are not looked for at eviction (that cost
a set probe per evicted block); a lookup or an insert that meets one drops it, and a
sweep drops the rest whenever the dict has doubled since the last one (each run is
swept at most once: constant cost per run).

One hash, one block, at the run's start: a run whose first hash another block already
holds is not added (first come keeps it). Further along, a block may come to hold a
hash that an unreachable block also holds (a run broken by an eviction, whose later
blocks another request then recomputes): that stale copy is never found again and is
evicted like any free block, as vLLM's pool allows duplicate hashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter

from genpool_core.block_hash import NO_HASH, BlockHash

MIN_SWEEP_RUNS = 256  # runs the dict may hold before its first sweep


def values(items: list[int], indexes: Sequence[int]) -> tuple[int, ...]:
    """``items`` at ``indexes`` (at least one), read in C: a third of a loop's time."""
    if len(indexes) == 1:
        return (items[indexes[0]],)
    return itemgetter(*indexes)(items)  # type: ignore[no-any-return]


class PrefixIndex:
    def __init__(self, num_blocks: int) -> None:
        self._hash_of = [NO_HASH] * (num_blocks + 1)  # the dummy block's stays empty
        self._runs: dict[BlockHash, Sequence[int]] = {}  # a run's first hash -> its blocks
        self._sweep_at = MIN_SWEEP_RUNS  # len(_runs) that triggers the next sweep
        self.num_cached = 0  # blocks that hold a hash

    def lookup(self, hashes: Sequence[BlockHash], limit: int | None = None) -> list[int]:
        """The blocks holding the longest run of ``hashes`` (at most ``limit`` of them)
        from the first. (A limit, not a slice: a slice would touch every hash object of
        the prompt, where a miss reads only the first.)"""
        runs, hash_of = self._runs, self._hash_of
        found: list[int] = []
        num_hashes = len(hashes) if limit is None else min(limit, len(hashes))
        while len(found) < num_hashes:
            start = len(found)
            key = hashes[start]
            run = runs.get(key)
            if run is None:
                break
            if hash_of[run[0]] != key:  # stale: its first block was evicted
                del runs[key]
                break
            run = run[: num_hashes - start]
            # The common case, a run still whole, in one comparison (C, not a loop).
            if values(hash_of, run) == tuple(hashes[start : start + len(run)]):
                found += run
                continue
            for block in run:
                if hash_of[block] != hashes[len(found)]:
                    break
                found.append(block)
        return found

    def add_run(self, blocks: Sequence[int], hashes: Sequence[BlockHash]) -> int:
        """Make ``blocks`` findable by ``hashes`` (aligned, one chain's consecutive links,
        none findable yet; the index keeps ``blocks``: not to be changed); how many were:
        all, or none when another block holds the first hash."""
        if not blocks or self.lookup(hashes, 1):
            return 0
        hash_of = self._hash_of
        for block, block_hash in zip(blocks, hashes, strict=True):
            hash_of[block] = block_hash
        self._runs[hashes[0]] = blocks  # (replaces a stale run of that key)
        self.num_cached += len(blocks)
        if len(self._runs) >= self._sweep_at:
            self._sweep()
        return len(blocks)

    def forget(self, blocks: Iterable[int]) -> list[BlockHash]:
        """Blocks that hold nothing findable from now; the hashes they held."""
        blocks = list(blocks)
        if not blocks:
            return []
        hash_of = self._hash_of
        removed = list(values(hash_of, blocks))
        if NO_HASH in removed:
            removed = [h for h in removed if h is not NO_HASH]
        for block in blocks:
            hash_of[block] = NO_HASH
        self.num_cached -= len(removed)
        return removed

    def drop(self, blocks: list[int]) -> None:
        """``forget`` without saying what they held: no hash object is read (each is a
        cache miss), only whether the block held one."""
        hash_of = self._hash_of
        num_held = 0
        for block in blocks:
            if hash_of[block] is not NO_HASH:
                hash_of[block] = NO_HASH
                num_held += 1
        self.num_cached -= num_held

    def clear(self) -> None:
        self._hash_of = [NO_HASH] * len(self._hash_of)
        self._runs.clear()
        self.num_cached = 0

    @property
    def num_runs(self) -> int:
        """Runs in the dict, stale ones not yet dropped included (tests)."""
        return len(self._runs)

    def _sweep(self) -> None:
        """Drop every stale run; the next sweep when the dict has doubled."""
        hash_of = self._hash_of
        self._runs = {key: run for key, run in self._runs.items() if hash_of[run[0]] == key}
        self._sweep_at = max(MIN_SWEEP_RUNS, 2 * len(self._runs))
