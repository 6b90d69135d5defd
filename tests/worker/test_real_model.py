"""The worker serving real SmolLM2-135M weights on the CPU, over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]
CHAT_FRANCE = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_smollm2_answers_paris_and_pausing_keeps_every_answer(worker_factory: Factory) -> None:
    worker = worker_factory(
        model="smollm2-135m", max_batch_size=2, max_seq_len=512,
        preemption_mode="target_output_tps", target_output_tps=1.0, paused_cap=2,
        resident_headroom=2, stat_interval_s=1.0,
    )  # fmt: skip
    with worker.client() as client:
        solo = client.post("/v1/completions", json={"prompt": CHAT_FRANCE, "max_tokens": 12})
        assert solo.status_code == 200, solo.text
        answer = solo.json()["choices"][0]["text"]
        assert "Paris" in answer
        stats = client.get("/stats").json()
        assert stats["synthetic"] is False and stats["model"].startswith("SmolLM2")

    prompts = [f"Count from {i} upwards: {i}," for i in range(1, 5)]
    lengths = [48, 48, 8, 8]

    async def overload() -> list[str]:
        async with worker.async_client() as client:

            async def one(prompt: str, delay: float, max_tokens: int = 16) -> str:
                await asyncio.sleep(delay)
                body = {"prompt": prompt, "max_tokens": max_tokens}  # keyed at receipt
                reply = await client.post("/v1/completions", json=body)
                assert reply.status_code == 200, reply.text
                return str(reply.json()["choices"][0]["text"])

            # 32 keyed warm-up admissions initialise X (about 2 s here); then two long
            # requests fill B = 2 and two short ones wait until they are at risk
            # (X - slack_s), when the long ones are paused in place to let them in.
            await asyncio.gather(*(one("Hi", 0, max_tokens=1) for _ in range(32)))
            delays = [0.0, 0.0, 0.3, 0.3]
            return list(
                await asyncio.gather(
                    *(one(p, d, n) for p, d, n in zip(prompts, delays, lengths, strict=True))
                )
            )

    together = asyncio.run(overload())
    with worker.client() as client:
        alone = []
        for prompt, n in zip(prompts, lengths, strict=True):
            reply = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": n})
            alone.append(reply.json()["choices"][0]["text"])
        time.sleep(1.2)  # the next stat line
        pauses = client.get("/stats").json()["pauses_total"]
    assert together == alone  # greedy: batching and pausing change no one's tokens
    assert pauses > 0
