"""Prefix-cache metrics of a run (docs/sim.md#prefix-caching): the hit rate the workers
got, the oracle's on the same trace, and TTFT by turn.

- ``prefix_hit_rate``: prompt tokens found cached at each request's first admission over
  its prompt tokens, summed over the measured requests (vllm:prefix_cache_hits /
  vllm:prefix_cache_queries, restricted to the window).
- ``prefix_oracle_hit_rate``: the same share for an infinite cache shared by every
  worker: a prompt's leading full blocks that some request arriving earlier in the run
  (the warm-up included) had computed, its prompt and every output token but the last
  (what a release registers), stopping at the first block never computed and leaving
  one prompt token to compute, as the core's lookup does.
- ``ttft_turn1_p90``, ``ttft_turns2_p50`` / ``ttft_turns2_p90``: TTFT of first turns and
  of later turns (whose prompts hold a history to hit).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from genpool_core.block_hash import BlockHash
from genpool_core.quantiles import percentile
from genpool_sim.records import SimRequest


def cached_prefix_blocks(request: SimRequest, seen: set[BlockHash], block_size: int) -> int:
    """The leading prompt blocks of ``request`` in ``seen``, one prompt token left over."""
    limit = (request.prompt_tokens - 1) // block_size
    count = 0
    for block_hash in request.block_hashes[:limit]:
        if block_hash not in seen:
            break
        count += 1
    return count


def computed_blocks(request: SimRequest, block_size: int) -> list[BlockHash]:
    """The full blocks a finished request made findable: its prompt and every output
    token but the last (the core's ``KVAccount.num_written``)."""
    written = request.prompt_tokens + max(0, request.output_tokens - 1)
    return request.block_hashes[: written // block_size]


def oracle_hits(requests: Iterable[SimRequest], block_size: int) -> dict[str, int]:
    """Cached prompt tokens per request id under an infinite cache that holds what every
    earlier arrival computed (``requests`` in any order; ties keep their order)."""
    seen: set[BlockHash] = set()
    hits: dict[str, int] = {}
    for request in sorted(requests, key=lambda r: r.arrival):
        hits[request.request_id] = cached_prefix_blocks(request, seen, block_size) * block_size
        seen.update(computed_blocks(request, block_size))
    return hits


def prefix_metrics(
    measured: Sequence[SimRequest], everyone: Iterable[SimRequest], block_size: int
) -> dict[str, float]:
    """The hit rates and turn TTFTs of ``measured`` (a conversation workload's requests)."""
    prompt_tokens = sum(r.prompt_tokens for r in measured)
    if not prompt_tokens:
        return {}
    oracle = oracle_hits(everyone, block_size)
    first = [r.ttft for r in measured if r.turn == 1 and r.ttft is not None]
    later = [r.ttft for r in measured if (r.turn or 0) >= 2 and r.ttft is not None]
    return {
        "prefix_hit_rate": sum(r.cached_tokens for r in measured) / prompt_tokens,
        "prefix_oracle_hit_rate": sum(oracle[r.request_id] for r in measured) / prompt_tokens,
        "ttft_turn1_p90": percentile(first, 90),
        "ttft_turns2_p50": percentile(later, 50),
        "ttft_turns2_p90": percentile(later, 90),
        "later_turn_share": len(later) / max(1, len(first) + len(later)),
    }
