"""The worker serving real SmolLM2-135M weights on the CPU, over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.polling import wait_for, wait_for_async
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

            async def one(prompt: str, max_tokens: int = 16) -> str:
                body = {"prompt": prompt, "max_tokens": max_tokens}  # keyed at receipt
                reply = await client.post("/v1/completions", json=body)
                assert reply.status_code == 200, reply.text
                return str(reply.json()["choices"][0]["text"])

            # 32 keyed warm-up admissions initialise X (about 2 s here); then two long
            # requests fill B = 2 and two short ones wait until they are at risk
            # (X - slack_s), when the long ones are paused in place to let them in.
            await asyncio.gather(*(one("Hi", max_tokens=1) for _ in range(32)))
            arrived = worker.engine.snapshot.stats.arrivals  # the warm-up's, all counted
            long = [
                asyncio.create_task(one(p, n))
                for p, n in zip(prompts[:2], lengths[:2], strict=True)
            ]

            def both_resident() -> bool:
                stats = worker.engine.snapshot.stats  # the last pass's counts
                return stats.arrivals == arrived + 2 and stats.residents == 2

            await wait_for_async(both_resident, "the two long requests to fill B = 2", 120)
            short = [one(p, n) for p, n in zip(prompts[2:], lengths[2:], strict=True)]
            return list(await asyncio.gather(*long, *short))

    together = asyncio.run(overload())
    with worker.client() as client:
        alone = []
        for prompt, n in zip(prompts, lengths, strict=True):
            reply = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": n})
            alone.append(reply.json()["choices"][0]["text"])
    assert together == alone  # greedy: batching and pausing change no one's tokens
    with worker.client() as client:
        # /stats repeats the last stat line (every stat_interval_s = 1 s): wait for one
        # that counts the overload's pauses.
        wait_for(lambda: client.get("/stats").json()["pauses_total"] > 0, "a pause counted", 30)
