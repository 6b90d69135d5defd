"""The ``recompute`` baseline (docs/design.md#simulator): vLLM-style, a worker evicts
instead of pausing; the evicted request is re-queued and its re-admission pays a prefill
of everything it had (prompt and generated tokens).

The eviction goes through the core's ``abort`` (its slot and KV blocks are released in
the next pass); the cluster calls :func:`evict_for_at_risk` before each pass and
:func:`requeue_evicted` for each aborted resident the pass reports.
"""

from __future__ import annotations

from collections.abc import Mapping

from genpool_core.request import GenRequest
from genpool_sim.records import SimRequest
from genpool_sim.replica import GenWorker

MAX_EVICTIONS_PER_PASS = 4


def evict_for_at_risk(
    worker: GenWorker, requests: Mapping[str, SimRequest], now: float, max_per_request: int
) -> None:
    """Drop the newest residents' KV so at-risk waiters get in, when no slot is free."""
    scheduler = worker.scheduler
    if not scheduler.queue.is_head_at_risk(now) or scheduler.slots.can_allocate():
        return
    budget = min(scheduler.queue.num_at_risk(now), MAX_EVICTIONS_PER_PASS)
    newest_first = reversed(scheduler.active_ids())
    for request_id in newest_first:
        if budget == 0:
            break
        request = requests[request_id]
        gen = request.gen
        assert gen is not None
        if (
            request.num_evictions >= max_per_request
            or gen.num_remaining_tokens == 0  # finished in the step that just ended
        ):
            continue
        request.num_evictions += 1
        scheduler.abort(request_id)
        budget -= 1


def requeue_evicted(worker: GenWorker, request: SimRequest, now: float) -> None:
    """Back into the worker's queue, with its tokens so far to recompute on admission."""
    old = request.gen
    assert old is not None
    request.gen = GenRequest(
        request_id=request.request_id,
        prompt_len=old.prompt_len,
        max_tokens=old.max_tokens,
        arrival_time=now,  # back of the line: no immediate re-eviction thrash
        first_token_time=old.first_token_time,
        num_output_tokens=old.num_output_tokens,
        slo_ttft_s=old.slo_ttft_s,
        target_output_tps=old.target_output_tps,
        block_hashes=old.block_hashes,  # its tokens are the same ones
    )
    request.gen.first_gen_token_time = old.first_gen_token_time
    worker.recompute_tokens[request.request_id] = old.prompt_len + old.num_output_tokens
    worker.scheduler.add_request(request.gen, now)
