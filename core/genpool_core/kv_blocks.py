"""The paged KV cache's accounting: blocks of ``block_size`` tokens (docs/design.md#kv-blocks).

A worker's KV memory is ``num_blocks`` blocks, sized from bytes at start. A request is
admitted only when the blocks it will ever use fit: ``prompt_len + max_tokens`` tokens,
block-rounded, reserved whole at admission (``reserved_blocks``) and given back when it
finishes. So a running request never needs a block it does not hold, and running out of
blocks can only make a waiter wait: nothing is dropped, evicted or recomputed. A paused
request keeps its blocks (that is what pausing in place costs), which is why the pause
for an at-risk waiter happens only if that waiter's blocks fit.

Blocks are handed out lowest id first, so every tensor-parallel rank and every rerun
agrees on every block table; the plan carries each admission's table.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from genpool_core.request import GenRequest


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


class BlockPool:
    """Free block ids, lowest first; ``num_blocks`` is the dummy (padding) block.

    Free space is kept as sorted extents ``[start, end)``: a request's blocks are taken
    and given back a run at a time, so a pass with 1024 residents of ~100 blocks each
    does not loop over every block in Python.
    """

    def __init__(self, budget: KVBudget) -> None:
        self.budget = budget
        self._starts: list[int] = [0]  # free extents, sorted and disjoint, never touching
        self._ends: list[int] = [budget.num_blocks]
        self._num_free = budget.num_blocks

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
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.budget.num_blocks - self._num_free

    def can_allocate(self, num_blocks: int) -> bool:
        return 0 <= num_blocks <= self._num_free

    def allocate(self, num_blocks: int) -> tuple[int, ...]:
        """The ``num_blocks`` lowest free ids, ascending (deterministic across ranks)."""
        return tuple(itertools.chain.from_iterable(self.allocate_runs(num_blocks)))

    def allocate_runs(self, num_blocks: int) -> tuple[range, ...]:
        """``allocate``'s ids as ascending runs of consecutive ids (what ``free_runs`` takes)."""
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"{num_blocks} KV blocks asked, {self._num_free} free")
        taken: list[range] = []
        left = num_blocks
        while left > 0:
            start, end = self._starts[0], self._ends[0]
            count = min(left, end - start)
            taken.append(range(start, start + count))
            if start + count == end:
                del self._starts[0], self._ends[0]
            else:
                self._starts[0] = start + count
            left -= count
        self._num_free -= num_blocks
        return tuple(taken)

    def free(self, blocks: Iterable[int]) -> None:
        """Give ``blocks`` back; any of them not allocated refuses the whole call."""
        self.free_runs([range(start, end) for start, end in _runs(sorted(blocks))])

    def free_runs(self, runs: Sequence[range]) -> None:
        """Give back ascending, disjoint runs (``allocate_runs``'); all checked first."""
        for run in runs:
            start, end = run.start, run.stop
            if not 0 <= start < end <= self.budget.num_blocks or self._overlaps(start, end):
                raise ValueError(f"KV block range [{start}, {end}) is not allocated")
        for before, after in itertools.pairwise(runs):
            if before.stop > after.start:
                raise ValueError(f"KV block {after.start} is given back twice: not allocated")
        for run in runs:
            self._insert(run.start, run.stop)
            self._num_free += len(run)

    def _overlaps(self, start: int, end: int) -> bool:
        i = bisect.bisect_right(self._starts, start)
        return (i > 0 and self._ends[i - 1] > start) or (
            i < len(self._starts) and self._starts[i] < end
        )

    def _insert(self, start: int, end: int) -> None:
        """Add the free extent ``[start, end)``, merged with the neighbours it touches."""
        i = bisect.bisect_right(self._starts, start)
        if i > 0 and self._ends[i - 1] == start:  # joins the extent before
            i -= 1
            start = self._starts[i]
            del self._starts[i], self._ends[i]
        if i < len(self._starts) and self._starts[i] == end:  # joins the extent after
            end = self._ends[i]
            del self._starts[i], self._ends[i]
        self._starts.insert(i, start)
        self._ends.insert(i, end)


def _runs(ordered: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` runs of consecutive ids (a repeated id starts a new run, which the
    caller refuses as overlapping)."""
    runs: list[tuple[int, int]] = []
    for block in ordered:
        if runs and runs[-1][1] == block:
            runs[-1] = (runs[-1][0], block + 1)
        else:
            runs.append((block, block + 1))
    return runs


class KVAccount:
    """The scheduler's side of the blocks: what a request needs, holds and gives back.

    ``budget`` None: no memory limit (the simulator's default, unit tests); requests then
    hold no blocks and only the request caps (B, H) bound admission.
    """

    def __init__(self, budget: KVBudget | None) -> None:
        self.pool = None if budget is None else BlockPool(budget)
        self._runs: dict[str, tuple[range, ...]] = {}  # each holder's blocks, as runs
        self._held: dict[str, tuple[range, ...]] = {}  # finished, KV exported: held on

    def num_needed(self, request: GenRequest) -> int:
        if self.pool is None:
            return 0
        return self.pool.budget.blocks_for(reserved_tokens(request.prompt_len, request.max_tokens))

    def check_fits_ever(self, request: GenRequest) -> None:
        """A request larger than the whole cache would block the queue head forever."""
        if self.pool is not None and self.num_needed(request) > self.pool.num_blocks:
            raise ValueError(
                f"prompt_len={request.prompt_len} + max_tokens={request.max_tokens} tokens need "
                f"{self.num_needed(request)} KV blocks of {self.pool.block_size} tokens; the "
                f"worker's KV cache has {self.pool.num_blocks}"
            )

    def can_fit(self, request: GenRequest | None) -> bool:
        if request is None:
            return False
        return self.pool is None or self.pool.can_allocate(self.num_needed(request))

    def reserve(self, request: GenRequest) -> None:
        if self.pool is not None:
            runs = self.pool.allocate_runs(self.num_needed(request))
            self._runs[request.request_id] = runs
            request.blocks = tuple(itertools.chain.from_iterable(runs))

    def release(self, request: GenRequest) -> None:
        if self.pool is not None:
            self.pool.free_runs(self._runs.pop(request.request_id))
        request.blocks = ()

    def hold(self, request: GenRequest) -> None:
        """A finished request's blocks stay allocated (its KV is exported, docs/pd.md) until
        ``release_held``: they count as used, so admission waits for them like any other."""
        if self.pool is not None:
            self._held[request.request_id] = self._runs.pop(request.request_id)

    def held_blocks(self, request_id: str) -> tuple[int, ...]:
        """A held request's block table (empty when it holds none)."""
        return tuple(itertools.chain.from_iterable(self._held.get(request_id, ())))

    def release_held(self, request_id: str) -> bool:
        """Give a held request's blocks back; False when it holds none (already released)."""
        runs = self._held.pop(request_id, None)
        if runs is None:
            return False
        assert self.pool is not None
        self.pool.free_runs(runs)
        return True

    def held_ids(self) -> tuple[str, ...]:
        """Finished requests whose blocks are still held, oldest first."""
        return tuple(self._held)

    @property
    def num_blocks(self) -> int:
        return 0 if self.pool is None else self.pool.num_blocks

    @property
    def num_used(self) -> int:
        return 0 if self.pool is None else self.pool.num_used
