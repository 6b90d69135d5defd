"""What a simulated GEN pass costs, what it tells the prefix cache, and where the router
sends a request (docs/sim.md#prefix-caching).

- **Cost**: a decode step for the batch members that decode (the step model's
  ``t0 + c * active + k * context``; with speculative decoding each member's drafted
  rows count as rows too), plus one prefill per prompt the pass computes: a
  colocated worker's admissions (``plan.prefill_ids``), each charged only for its
  uncached tokens (``prompt - admitted_cached_tokens``: prefill starts after the
  cached prefix, as the worker's does), and the ``recompute`` baseline's rebuilt KV.
- **Hashes as tokens fill**: after each pass a request's ``block_hashes`` gain every
  output block that has filled, as the worker's engine appends them, so its reply is
  findable when it is released (the scheduler's next pass) and the next turn hits it.
- **Routing**: least loaded (residents + waiters), or prefix-aware: the worker holding
  the longest cached prefix of the prompt among those at most B / 4 requests busier than
  the least loaded (ties: less loaded, lower index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from genpool_core.plan import GenPlan
from genpool_core.stepmodel import StepModel
from genpool_sim.records import SimRequest
from genpool_sim.replica import GenWorker

LEAST_LOADED, PREFIX_AWARE = "least-loaded", "prefix-aware"
ROUTERS = (LEAST_LOADED, PREFIX_AWARE)


def pass_seconds(
    model: StepModel,
    plan: GenPlan,
    requests: Mapping[str, SimRequest],
    recompute_tokens: dict[str, int],
) -> float:
    """The pass's time: its decode step, its prefills after their cached tokens, and the
    recomputed KV of re-admitted evictions (whose entries it takes)."""
    prefilled = set(plan.prefill_ids)
    limits = [len(drafts) for drafts in plan.drafts] or [0] * len(plan.batch_ids)
    decoding, context = 0, 0
    for request_id, limit in zip(plan.batch_ids, limits, strict=True):
        if request_id not in prefilled:
            gen = requests[request_id].gen
            assert gen is not None
            decoding += 1 + limit  # its token's row and its drafts' (genpool_sim.speculation)
            context += (1 + limit) * (gen.prompt_len + gen.num_output_tokens)
    seconds = model.decode_step_time(decoding, context) if decoding else 0.0
    cached = plan.admitted_cached_tokens or (0,) * len(plan.admitted_ids)
    for request_id, num_cached in zip(plan.admitted_ids, cached, strict=True):
        recomputed = recompute_tokens.pop(request_id, None)
        if recomputed is not None:  # the evicted KV is rebuilt by a prefill
            seconds += model.prefill_time(recomputed)
        elif request_id in prefilled:
            gen = requests[request_id].gen
            assert gen is not None
            seconds += model.prefill_time(gen.prompt_len - num_cached)
    return seconds


def fill_hashes(plan: GenPlan, requests: Mapping[str, SimRequest], block_size: int) -> None:
    """After ``postprocess``: each batch member's filled output blocks join its hashes."""
    for request_id in plan.batch_ids:
        request = requests[request_id]
        gen = request.gen
        assert gen is not None
        full = min(
            len(request.block_hashes), (gen.prompt_len + gen.num_output_tokens) // block_size
        )
        if full > len(gen.block_hashes):
            gen.block_hashes.extend(request.block_hashes[len(gen.block_hashes) : full])


def route(workers: Sequence[GenWorker], request: SimRequest, router: str) -> GenWorker:
    """The routable worker that takes ``request`` (``workers`` are the routable ones)."""
    least = min(workers, key=lambda w: (w.load, w.index))
    if router == LEAST_LOADED or not request.block_hashes:
        return least
    # prefix-aware: the longest cached prefix among the workers at most a quarter of a
    # batch busier than the least loaded (affinity without piling onto one worker)
    slack = max(1, least.scheduler.max_batch_size // 4)
    near = [w for w in workers if w.load <= least.load + slack]
    return min(near, key=lambda w: (-_cached_blocks(w, request), w.load, w.index))


def _cached_blocks(worker: GenWorker, request: SimRequest) -> int:
    """The prompt's leading blocks ``worker``'s prefix cache holds (what admission finds)."""
    kv = worker.scheduler.kv
    if kv.pool is None or not kv.is_caching:
        return 0
    limit = (request.prompt_tokens - 1) // kv.pool.block_size
    return len(kv.pool.lookup(request.block_hashes, limit).blocks)
