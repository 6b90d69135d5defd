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

import heapq
from collections.abc import Iterable
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

    @classmethod
    def for_tokens(cls, num_tokens: int, block_size: int) -> KVBudget:
        """The smallest budget holding ``num_tokens`` tokens."""
        return cls(-(-num_tokens // block_size), block_size)

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
    """Free block ids, lowest first; ``num_blocks`` is the dummy (padding) block."""

    def __init__(self, budget: KVBudget) -> None:
        self.budget = budget
        self._free: list[int] = list(range(budget.num_blocks))  # sorted: a valid heap

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
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.budget.num_blocks - len(self._free)

    def can_allocate(self, num_blocks: int) -> bool:
        return 0 <= num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> tuple[int, ...]:
        """The ``num_blocks`` lowest free ids, ascending (deterministic across ranks)."""
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"{num_blocks} KV blocks asked, {len(self._free)} free")
        return tuple(heapq.heappop(self._free) for _ in range(num_blocks))

    def free(self, blocks: Iterable[int]) -> None:
        given = tuple(blocks)
        held = set(self._free)
        for block in given:
            if not 0 <= block < self.budget.num_blocks or block in held:
                raise ValueError(f"KV block {block} is not allocated")
            held.add(block)
        for block in given:
            heapq.heappush(self._free, block)


class KVAccount:
    """The scheduler's side of the blocks: what a request needs, holds and gives back.

    ``budget`` None: no memory limit (the simulator's default, unit tests); requests then
    hold no blocks and only the request caps (B, H) bound admission.
    """

    def __init__(self, budget: KVBudget | None) -> None:
        self.pool = None if budget is None else BlockPool(budget)

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
            request.blocks = self.pool.allocate(self.num_needed(request))

    def release(self, request: GenRequest) -> None:
        if self.pool is not None:
            self.pool.free(request.blocks)
        request.blocks = ()

    @property
    def num_blocks(self) -> int:
        return 0 if self.pool is None else self.pool.num_blocks

    @property
    def num_used(self) -> int:
        return 0 if self.pool is None else self.pool.num_used
