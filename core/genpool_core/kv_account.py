"""The scheduler's side of the KV blocks: what a request needs, what the prefix cache
already holds for it, what it holds and gives back (docs/design.md#kv-blocks).

A request is admitted only when every block it will ever use fits: its prompt plus
``max_tokens``, block-rounded, taken whole at admission and given back when it finishes,
so a running request never needs a block it does not hold and running out of blocks can
only make a waiter wait. With prefix caching the prompt's leading full blocks that are
cached are held, not taken (``num_cached_tokens``: prefill starts after them), so
admission reserves only what is not cached; at least one prompt token is always
computed (its logits give the first output token). Blocks become findable once the
plan has scheduled their tokens (``register_computed``; a pass runs its prefill work in
plan order, so a later admission in the same pass may share them) and, for the output,
when the request ends (the hashes the worker appended). A paused request keeps its
blocks, so what it shares stays pinned.

``budget`` None: no memory limit (the simulator's default, unit tests); requests then
hold no blocks and only the request caps (B, H) bound admission.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from genpool_core.kv_blocks import BlockPool, KVBudget, KVEvent, reserved_tokens
from genpool_core.kv_index import Held, PrefixHit
from genpool_core.request import GenRequest


@dataclass(slots=True)
class _Holding:
    """One request's blocks as the pool knows them: its table's first ``num_registered``
    blocks through cached runs, except ``unshared`` (blocks a registration left plain:
    other runs held their hashes already), and the rest plain."""

    runs: list[Held] = field(default_factory=list)
    num_registered: int = 0
    unshared: list[int] = field(default_factory=list)
    is_forgotten: bool = False  # its KV is not what its hashes say: it registers no more


_NO_HIT = PrefixHit([], [])


class KVAccount:
    def __init__(self, budget: KVBudget | None, *, is_caching: bool = False,
                 is_checked: bool = True, is_recording: bool = True) -> None:  # fmt: skip
        """``is_recording``: keep KV events for a publisher (``take_events``)."""
        self.pool = (
            None
            if budget is None
            else BlockPool(budget, is_checked=is_checked, is_recording=is_recording)
        )
        self.is_caching = is_caching and self.pool is not None
        self._holdings: dict[str, _Holding] = {}  # residents (caching on)
        # Finished, KV exported: held on (their tables, and how the pool knows them).
        self._held: dict[str, tuple[tuple[int, ...], _Holding | None]] = {}
        # The last lookup: (request, the pool's num_forgets then, its hit). ``can_fit``
        # and ``reserve`` of one admission share it; one that failed to fit looks again
        # next time if anything was evicted since (its hits may hold other KV now).
        self._hit: tuple[GenRequest | None, int, PrefixHit] = (None, 0, _NO_HIT)
        self.num_queried_tokens = 0  # prompt tokens looked up (vllm:prefix_cache_queries)
        self.num_hit_tokens = 0  # of them, found cached (vllm:prefix_cache_hits)

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

    def _cached_prefix(self, request: GenRequest) -> PrefixHit:
        """The cached blocks ``request``'s prompt starts with, leaving one token to compute
        (caching on)."""
        if not request.block_hashes or request.num_output_tokens:
            return _NO_HIT
        pool = self.pool
        assert pool is not None
        last, num_forgets, hit = self._hit
        if last is request and num_forgets == pool.num_forgets:
            return hit
        hit = pool.lookup(request.block_hashes, (request.prompt_len - 1) // pool.block_size)
        self._hit = (request, pool.num_forgets, hit)
        return hit

    def can_fit(self, request: GenRequest | None) -> bool:
        if request is None:
            return False
        pool = self.pool
        if pool is None:
            return True
        num_needed = self.num_needed(request)
        if num_needed <= pool.num_free:  # fits even if every hit were free
            return True
        if not self.is_caching:
            return False
        hit = self._cached_prefix(request)
        return pool.can_allocate(num_needed - len(hit.blocks) + pool.num_evictable(hit))

    def reserve(self, request: GenRequest) -> None:
        """Hold the cached prefix and take the rest (``can_fit`` first)."""
        pool = self.pool
        if pool is None:
            return
        if not self.is_caching:
            request.blocks = tuple(pool.allocate(self.num_needed(request)))
            request.num_cached_tokens = 0
            return
        hit = self._cached_prefix(request)
        self._hit = (None, 0, _NO_HIT)
        num_hits = len(hit.blocks)
        runs = pool.hold(hit) if num_hits else []
        request.blocks = tuple(hit.blocks + pool.allocate(self.num_needed(request) - num_hits))
        request.num_cached_tokens = num_hits * pool.block_size
        self._holdings[request.request_id] = _Holding(runs, num_hits)
        if not request.num_output_tokens:
            self.num_queried_tokens += request.prompt_len
            self.num_hit_tokens += request.num_cached_tokens

    def register_computed(self, request: GenRequest, num_tokens: int) -> None:
        """The plan computes ``request``'s first ``num_tokens`` tokens' KV by the end of
        this pass: make its full blocks among them findable."""
        holding = self._holdings.get(request.request_id) if self.is_caching else None
        if holding is None or holding.is_forgotten:
            return
        assert self.pool is not None
        done = holding.num_registered
        full = min(num_tokens // self.pool.block_size, len(request.block_hashes))
        if full <= done:
            return
        # What other runs hold already stays plain (first come keeps the chain): with
        # requests prefilled side by side, the chunk where their prompts part holds
        # both, and only the blocks past the shared ones are this request's to register.
        start = max(done, len(self.pool.lookup(request.block_hashes, full).blocks))
        holding.unshared += request.blocks[done:start]
        held = None
        if start < full:
            parent = request.block_hashes[start - 1] if start else None
            held = self.pool.cache(request.request_id, start, request.blocks[start:full],
                                   request.block_hashes[start:full], parent)  # fmt: skip
        if held is None:
            holding.unshared += request.blocks[start:full]
        else:
            holding.runs.append(held)
        holding.num_registered = full

    def num_written(self, request: GenRequest) -> int:
        """Tokens whose KV is in the blocks: the prompt and every output token but the
        last (its KV is written by the step that would read it)."""
        return request.prompt_len + max(0, request.num_output_tokens - 1)

    def release(self, request: GenRequest) -> None:
        if self.pool is not None:
            self.register_computed(request, self.num_written(request))
            self._give_back(request.blocks, self._holdings.pop(request.request_id, None))
        request.blocks = ()

    def _give_back(self, blocks: tuple[int, ...], holding: _Holding | None) -> None:
        assert self.pool is not None
        if holding is None:
            self.pool.free(blocks)
            return
        self.pool.release(holding.runs)
        self.pool.free(holding.unshared)
        self.pool.free(blocks[holding.num_registered :])

    def forget(self, request: GenRequest) -> None:
        """``request``'s KV is not what its hashes say (its prefill failed): whatever it
        made findable is forgotten, so nobody shares it, and it registers no more."""
        holding = self._holdings.get(request.request_id)
        if holding is None or holding.is_forgotten:
            return
        assert self.pool is not None
        if holding.runs:
            self.pool.uncache(holding.runs)
        holding.is_forgotten = True

    def hold(self, request: GenRequest) -> None:
        """A finished request's blocks stay held (its KV is exported, docs/pd.md) until
        ``release_held``: they count as used, so admission waits for them like any other."""
        if self.pool is not None:
            self.register_computed(request, self.num_written(request))
            holding = self._holdings.pop(request.request_id, None)
            self._held[request.request_id] = (request.blocks, holding)

    def held_blocks(self, request_id: str) -> tuple[int, ...]:
        """A held request's block table (empty when it holds none)."""
        held = self._held.get(request_id)
        return () if held is None else held[0]

    def release_held(self, request_id: str) -> bool:
        """Give a held request's blocks back; False when it holds none (already released)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return False
        self._give_back(*held)
        return True

    def held_ids(self) -> tuple[str, ...]:
        """Finished requests whose blocks are still held, oldest first."""
        return tuple(self._held)

    def num_held_only_by(self, requests: Iterable[GenRequest]) -> int:
        """Blocks that only ``requests`` (residents) hold: the memory they pin."""
        num_plain, runs = 0, []
        for request in requests:
            holding = self._holdings.get(request.request_id)
            num_plain += len(request.blocks)
            if holding is not None:
                num_plain -= holding.num_registered - len(holding.unshared)
                runs += holding.runs
        return num_plain + BlockPool.num_held_only_by(runs)

    def take_events(self) -> list[KVEvent]:
        return [] if self.pool is None else self.pool.take_events()

    @property
    def num_blocks(self) -> int:
        return 0 if self.pool is None else self.pool.num_blocks

    @property
    def num_used(self) -> int:
        return 0 if self.pool is None else self.pool.num_used

    @property
    def num_cached(self) -> int:
        return 0 if self.pool is None else self.pool.num_cached
