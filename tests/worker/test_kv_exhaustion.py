"""A SmolLM2 worker driven into KV-block exhaustion in every mode loses nothing
(docs/design.md#kv-blocks): every request finishes, with the text an unconstrained worker
gives it, while the queue head waited for blocks with batch positions free."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import EngineRequest
from tests.polling import wait_for
from tests.worker.conftest import RunningWorker, complete, run_worker

Factory = Callable[..., RunningWorker]
# 30 layers x 3 KV heads x 64 dims x K and V x 4 bytes (float32) per token.
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 3 * 64 * 2 * 4
BASE = {"model": "smollm2-135m", "max_batch_size": 4, "max_seq_len": 128}
PROMPTS = [(f"Write the number {i} in words, then count on:", 30 + 5 * (i % 5)) for i in range(8)]
MODES = {
    "off": {},
    "tpot_budget": {"preemption_mode": "tpot_budget", "tpot_budget": 0.05,
                    "resident_headroom": 4, "paused_cap": 3},
    "target_output_tps": {"preemption_mode": "target_output_tps", "target_output_tps": 30.0,
                          "resident_headroom": 4, "paused_cap": 3},
}  # fmt: skip


class MemoryBound:
    """Counts the passes after which a waiter could not be admitted for lack of blocks
    alone: a batch position free, the resident caps not reached, the head's blocks not free."""

    def __init__(self) -> None:
        self.engine: GenEngine | None = None
        self.passes = 0

    def on_plan(self, plan: GenPlan) -> None:
        assert self.engine is not None
        scheduler = self.engine.scheduler
        head = scheduler.queue.peek()
        is_blocked = head is not None and not scheduler.kv.can_fit(head)
        has_room = scheduler.num_active < scheduler.max_batch_size and (
            scheduler.slots.can_allocate()
        )
        self.passes += is_blocked and has_room

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None:
        assert reason is not FinishReason.ABORT, request.request_id


def _complete_all(worker: RunningWorker) -> list[str]:
    async def run() -> list[str]:
        async with worker.async_client() as client:

            async def one(prompt: str, max_tokens: int) -> str:
                choice = await complete(client, prompt, max_tokens)
                return f"{choice['finish_reason']}: {choice['text']}"

            return list(await asyncio.gather(*(one(p, n) for p, n in PROMPTS)))

    return asyncio.run(run())


@pytest.fixture(scope="module")
def unconstrained() -> list[str]:
    """Every prompt's finish reason and text from a worker with room for all 8 at once (the
    default cache)."""
    with run_worker(**(BASE | {"max_batch_size": 8})) as worker:
        return _complete_all(worker)


@pytest.mark.parametrize("mode", list(MODES))
def test_block_exhaustion_loses_nothing_and_changes_no_text(
    worker_factory: Factory, unconstrained: list[str], mode: str
) -> None:
    # 12 blocks of 16 tokens (1.5 requests of max_seq_len); each request holds 3 or 4
    # (12 prompt + 30..50 output tokens), so memory binds before B = 4 and B + H = 8 do.
    observer = MemoryBound()
    budget = 13 * 16 * SMOLLM2_KV_BYTES_PER_TOKEN  # 12 blocks and the dummy
    worker = worker_factory(**BASE, **MODES[mode], kv_cache_memory=budget, observer=observer)
    observer.engine = worker.engine
    assert worker.engine.model_info.num_kv_blocks == 12
    assert _complete_all(worker) == unconstrained
    assert observer.passes > 0, "the run never waited for blocks"
    # A reply is sent during the pass that finishes its request; that pass's snapshot
    # (published at its end) is the first without it.
    stats = wait_for(
        lambda: (s := worker.engine.snapshot.stats).completed == len(PROMPTS) and s,
        "the snapshot after the last request's finish",
        10,
        interval=0.02,
    )
    assert stats.kv_blocks_used == 0
