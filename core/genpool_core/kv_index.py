"""What the prefix cache can find, and who holds it: cached runs of blocks
(docs/design.md#prefix-caching).

A prompt is looked up as a chain from its first block, never one hash alone, so the
cache keeps *runs*, not blocks: the blocks one registration made findable (consecutive
links of a chain), keyed by the hash of the first. Holders are counted per run, not per
block, the way SGLang's radix tree counts them per node: a holder holds a run's first
``k`` blocks (a hit may end inside a run; the run's writer holds all of it), and
``holds`` counts holders by ``k``. So admitting a request that shares a 1024-token
system prompt is one count, not 64, and its release is one count back.

Only a run's tail beyond its longest hold (``max_held``) is free; it is evicted from its
end, so a run stays a run: its blocks always hold exactly its ``hashes``, and a run
emptied by eviction leaves the index. A chain hash pins every token before it, so two
chains that agree at a block agree at every block before it, and once they differ they
never agree again: a lookup compares a run's last hash with the prompt's (one
comparison, where comparing every hash read the prompt's hash objects, cold since its
arrival), and where they differ a binary search finds the first difference. (Two
different chains agreeing on a 64-bit hash is the collision every hash-keyed prefix
cache accepts.)

One run per first hash: a registration whose first hash is findable already makes no
run (first come keeps the chain; its blocks stay plain; the scheduler's account
registers only what a lookup of the request's chain does not find,
:mod:`genpool_core.kv_account`). A run stops being findable
(``key`` None) only when its KV is forgotten (a failed prefill). Further along, a run
may come to hold hashes that another run holds too (a chain broken by an eviction,
whose later blocks another request then recomputes): both stay findable from where a
lookup reaches them, as vLLM's pool allows duplicate hashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from genpool_core.block_hash import BlockHash


class CachedRun:
    """Blocks holding consecutive links of one chain, and who holds how many of them."""

    __slots__ = ("blocks", "hashes", "holds", "key", "max_held", "queued_at")

    def __init__(self, key: BlockHash | None, hashes: list[BlockHash],
                 blocks: list[int]) -> None:  # fmt: skip
        self.key = key  # its first hash while findable by it; None: no lookup finds it
        self.hashes = hashes
        self.blocks = blocks
        self.holds: dict[int, int] = {}  # blocks held from its start -> how many hold that many
        self.max_held = 0  # the longest hold: blocks beyond it are free
        self.queued_at = 0  # its tick in the LRU (genpool_core.kv_lru); 0: not queued

    @property
    def num_free(self) -> int:
        return len(self.blocks) - self.max_held

    def hold(self, num_blocks: int) -> None:
        holds = self.holds
        holds[num_blocks] = holds.get(num_blocks, 0) + 1
        if num_blocks > self.max_held:
            self.max_held = num_blocks

    def let_go(self, num_blocks: int) -> None:
        holds = self.holds
        count = holds[num_blocks] - 1
        if count:
            holds[num_blocks] = count
        else:
            del holds[num_blocks]
            if num_blocks == self.max_held:
                self.max_held = max(holds, default=0)

    def num_holders(self, position: int) -> int:
        """Holders of its block at ``position``."""
        return sum(count for held, count in self.holds.items() if held > position)

    def num_held_only(self, lengths: list[int]) -> int:
        """How many of its blocks only the holders of ``lengths`` (some of its holds, one
        per holder) hold."""
        num_only, start = 0, 0
        for cut in sorted(set(self.holds) | set(lengths)):
            # Blocks start .. cut - 1 are held by the holds of cut blocks or more.
            num_all = sum(count for held, count in self.holds.items() if held >= cut)
            num_given = sum(1 for held in lengths if held >= cut)
            if num_given and num_given == num_all:
                num_only += cut - start
            start = cut
        return num_only


Held = tuple[CachedRun, int]  # a run and how many of its first blocks one holder holds


@dataclass(slots=True)
class PrefixHit:
    """The cached blocks a prompt starts with, and the runs they lie in."""

    blocks: list[int]
    runs: list[Held]


def _num_shared(run: list[BlockHash], hashes: Sequence[BlockHash], start: int, size: int) -> int:
    """How many of ``run``'s first ``size`` hashes ``hashes`` has from ``start`` (the
    first agrees: the run's key): a binary search, as chains never agree again."""
    agree, differ = 1, size  # run[:agree] agrees; run[differ - 1] may not
    while agree < differ:
        middle = (agree + differ) // 2
        if run[middle] == hashes[start + middle]:
            agree = middle + 1
        else:
            differ = middle
    return agree


class PrefixIndex:
    def __init__(self) -> None:
        self._runs: dict[BlockHash, CachedRun] = {}  # a findable run's first hash -> it
        self.num_cached = 0  # blocks in findable runs

    def lookup(self, hashes: Sequence[BlockHash], limit: int | None = None) -> PrefixHit:
        """The blocks holding the longest run of ``hashes`` (at most ``limit`` of them)
        from the first."""
        runs = self._runs
        hit = PrefixHit([], [])
        num_hashes = len(hashes) if limit is None else min(limit, len(hashes))
        start = 0
        while start < num_hashes:
            run = runs.get(hashes[start])
            if run is None:
                break
            size = min(len(run.hashes), num_hashes - start)
            if run.hashes[size - 1] != hashes[start + size - 1]:
                size = _num_shared(run.hashes, hashes, start, size)
            hit.blocks += run.blocks[:size]
            hit.runs.append((run, size))
            start += size  # (where the prompt leaves the run, another may go on)
        return hit

    def add(self, run: CachedRun) -> bool:
        """Make ``run`` findable by its key; False (and nothing done) when another run
        holds that hash already."""
        if run.key is None or run.key in self._runs:
            return False
        self._runs[run.key] = run
        self.num_cached += len(run.blocks)
        return True

    def trimmed(self, run: CachedRun, num_blocks: int) -> None:
        """``num_blocks`` were evicted from ``run``'s end: an empty run leaves."""
        if run.key is None:
            return
        self.num_cached -= num_blocks
        if not run.blocks:
            del self._runs[run.key]
            run.key = None

    def forget(self, run: CachedRun) -> list[BlockHash]:
        """``run`` is findable no more (its blocks stay held); the hashes it held."""
        if run.key is None:
            return []
        del self._runs[run.key]
        run.key = None
        self.num_cached -= len(run.blocks)
        return list(run.hashes)

    def clear(self) -> Iterable[CachedRun]:
        """Forget every run; the runs that were findable."""
        runs = list(self._runs.values())
        for run in runs:
            run.key = None
        self._runs.clear()
        self.num_cached = 0
        return runs
