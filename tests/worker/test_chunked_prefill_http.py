"""Chunked prefill through HTTP (--max-prefill-tokens-per-pass): SmolLM2's answers are
the whole-prefill answers, and the plans show prompts prefilled over several passes
while other requests decode."""

from __future__ import annotations

import asyncio

from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason
from genpool_worker.engine_io import EngineRequest
from tests.polling import wait_for_async
from tests.worker.conftest import run_worker

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "The story should have a beginning, a middle and an end, and mention the sea. " * (i + 1)
    for i in range(3)
]


class ChunkRecorder:
    def __init__(self) -> None:
        self.plans: list[GenPlan] = []

    def on_plan(self, plan: GenPlan) -> None:
        self.plans.append(plan)

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None:
        pass


def _answers(budget: int, recorder: ChunkRecorder | None = None) -> list[str]:
    """``budget`` 0: every prompt prefilled whole."""
    overrides: dict[str, object] = {"model": "smollm2-135m", "max_seq_len": 512,
                                    "max_prefill_tokens_per_pass": budget}  # fmt: skip
    with run_worker(observer=recorder, **overrides) as worker:

        async def all_at_once() -> list[str]:
            async with worker.async_client() as client:

                async def one(prompt: str, index: int) -> str:
                    # Each prompt goes in once the ones before it are decoding, so later
                    # prefills run beside running decodes.
                    await wait_for_async(
                        lambda: worker.engine.snapshot.tokens_total >= index or None,
                        f"{index} tokens out before prompt {index} is sent",
                        60,
                    )
                    body = {"prompt": prompt, "max_tokens": 16}
                    reply = await client.post("/v1/completions", json=body)
                    assert reply.status_code == 200, reply.text
                    return str(reply.json()["choices"][0]["text"])

                return list(await asyncio.gather(*(one(p, i) for i, p in enumerate(PROMPTS))))

        return asyncio.run(all_at_once())


def test_chunked_prefill_answers_equal_whole_prefill() -> None:
    recorder = ChunkRecorder()
    whole = _answers(0)
    chunked = _answers(16, recorder)
    assert chunked == whole
    for plan in recorder.plans:  # over the budget only for a prompt alone in its pass
        total = sum(end - start for _, start, end in plan.prefill_chunks)
        assert total <= 16 or plan.batch_ids == plan.prefill_ids
    # Some pass ran a chunk short of its prompt while another request decoded.
    assert any(
        plan.batch_ids and any(rid not in plan.prefill_ids for rid, _, _ in plan.prefill_chunks)
        for plan in recorder.plans
    )
