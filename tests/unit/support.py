"""Builders shared by the scheduling-core unit tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity, PolicyBase, Victim
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig


def make_scheduler(
    max_batch_size: int = 4,
    settings: dict[str, object] | None = None,
    *,
    target_x: float | None = None,
    max_num_active_requests: int | None = None,
    **config: object,
) -> GenScheduler:
    config.setdefault("check_kv", True)  # every block release checked against the holders
    scheduler = GenScheduler.from_settings(
        settings or {},
        GenCapacity(max_batch_size, max_num_active_requests),
        SchedulerConfig(**config),  # type: ignore[arg-type]
    )
    if target_x is not None:
        # Skip the 32-admission warm-up: the tests pick X to make slack exact.
        scheduler.queue.target.value = target_x
    return scheduler


def keyed(
    request_id: str,
    arrival: float,
    max_tokens: int = 100,
    first_token_time: float | None = None,
    prompt_len: int = 16,
) -> GenRequest:
    return GenRequest(
        request_id=request_id,
        prompt_len=prompt_len,
        max_tokens=max_tokens,
        arrival_time=arrival,
        first_token_time=arrival if first_token_time is None else first_token_time,
    )


def unkeyed(request_id: str, max_tokens: int = 100) -> GenRequest:
    return GenRequest(request_id=request_id, prompt_len=8, max_tokens=max_tokens)


def run_pass(
    scheduler: GenScheduler, now: float, dt: float = 0.1, stop_ids: tuple[str, ...] = ()
) -> GenPlan:
    """One pass at ``now`` whose batch produces its tokens at ``now + dt``."""
    plan = scheduler.step(now)
    scheduler.postprocess(plan, now + dt, stop_ids)
    return plan


def check_invariants(scheduler: GenScheduler) -> None:
    """docs/design.md#capacity, against the capacity in force (live decreases never evict)."""
    headroom, cap = scheduler.capacity_in_force()
    b = scheduler.max_batch_size
    assert scheduler.num_active <= b
    assert scheduler.num_residents <= b + headroom
    assert scheduler.num_paused <= cap
    assert cap <= headroom
    prefilling = len(scheduler.prefilling_ids())  # chunked prefill: resident, not in the batch
    assert scheduler.num_residents == scheduler.num_active + scheduler.num_paused + prefilling
    assert scheduler.slots.num_used == scheduler.num_residents
    check_blocks(scheduler)


def check_blocks(scheduler: GenScheduler) -> None:
    """docs/design.md#kv-blocks: every resident holds exactly its reservation, each block's
    holders are its reference count (shared only through the prefix cache), the pool
    counts the blocks held."""
    residents = [*scheduler.active_ids(), *scheduler.prefilling_ids()]
    requests = [*map(scheduler.get_request, residents), *scheduler.pausing]
    held = [b for request in requests for b in request.blocks]
    held += [b for i in scheduler.kv.held_ids() for b in scheduler.kv.held_blocks(i)]
    holders = Counter(held)
    assert len(holders) == scheduler.kv.num_used
    pool = scheduler.kv.pool
    assert pool is None or all(pool.num_holders(b) == n for b, n in holders.items())
    assert scheduler.kv.is_caching or len(held) == len(holders)
    for request in requests:
        assert len(request.blocks) == scheduler.kv.num_needed(request)


def make_active(
    request_id: str,
    *,
    max_tokens: int,
    gen_tokens: int,
    now: float,
    unpaused: float | None = None,
    first_token_time: float = 0.0,
    resident_since: float = 0.0,
) -> GenRequest:
    """A resident, active request that decoded ``gen_tokens`` in ``unpaused`` seconds."""
    from genpool_core.request import RequestStatus

    request = GenRequest(
        request_id=request_id,
        prompt_len=16,
        max_tokens=max_tokens,
        arrival_time=resident_since,
        first_token_time=first_token_time,
    )
    request.status = RequestStatus.ACTIVE
    request.resident_since = resident_since
    request.tokens_at_admission = 1
    request.num_output_tokens = 1 + gen_tokens
    request.active_since = now - (now - resident_since if unpaused is None else unpaused)
    request.run_started_at = resident_since
    request.tokens_at_run_start = 1
    request.is_slo_counted = True
    return request


def choose_victim(policy: PolicyBase, batch: Sequence[GenRequest], now: float) -> Victim | None:
    """The policy's first victim with ``batch`` (in batch order) as its batch."""
    for request in batch:
        policy.on_batch_enter(request)
    try:
        return policy.choose_victim(now)
    finally:
        for request in batch:
            policy.on_batch_leave(request)


def write_small_trace(path: Path) -> Path:
    """A 300-request CSV trace (arrivals every 0.5 s) for the simulator's CLI tests."""
    rows = "\n".join(f"{i * 0.5},{200 + i % 50},{30 + i % 40}" for i in range(300))
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows + "\n")
    return path
