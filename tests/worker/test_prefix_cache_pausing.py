"""Prefix caching on real SmolLM2-135M weights under pausing (issue 34): with a shared
prompt prefix, requests hold its cached blocks, some are paused in place while an
at-risk waiter runs, and every request's greedy text equals a worker without caching.
A cached block read before its KV was written, or overwritten while a paused request
still shares it, would change the text. The same overload with speculative decoding
(issue 37; n-gram and early-exit drafts) decodes the same text too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tests.polling import wait_for, wait_for_async
from tests.worker.conftest import RunningWorker, complete
from tests.worker.pd_support import metric

Factory = Callable[..., RunningWorker]
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}  # fmt: skip
EARLY_EXIT = {"method": "early_exit", "num_speculative_tokens": 2, "num_draft_layers": 24}
SHARED = (
    "You are a patient maths tutor. Answer in digits only, one number after another, "
    "separated by commas, and never explain. "
)  # about 30 tokens: one full block of 16 shared, and the start of another
PROMPTS = [f"{SHARED}Count from {i} upwards: {i}," for i in range(1, 5)]
LENGTHS = [24, 24, 8, 8]
# X <= slack_s (0.5 s): a keyed waiter is at risk as soon as it waits, so the short
# requests pause the long ones whatever the machine's speed (X learned from the warm-ups
# could otherwise exceed the long requests' whole run, and nothing would pause).
WORKER = {"model": "smollm2-135m", "max_batch_size": 2, "max_seq_len": 512,
          "preemption_mode": "target_output_tps", "target_output_tps": 1.0, "paused_cap": 2,
          "resident_headroom": 2, "stat_interval_s": 1.0,
          "admission_target_max_s": 0.5}  # fmt: skip


def _overload(worker: RunningWorker) -> list[str]:
    """Two long requests fill B = 2; two short ones become at risk and are let in by
    pausing the long ones (after 32 keyed warm-ups initialise X)."""

    async def run() -> list[str]:
        async with worker.async_client() as client:

            async def one(prompt: str, max_tokens: int) -> str:
                return str((await complete(client, prompt, max_tokens))["text"])

            await asyncio.gather(*(one(SHARED + "Hi", 1) for _ in range(32)))
            arrived = worker.engine.snapshot.stats.arrivals
            long = [asyncio.create_task(one(p, n)) for p, n in zip(PROMPTS[:2], LENGTHS[:2],
                                                                     strict=True)]  # fmt: skip

            def both_resident() -> bool:
                stats = worker.engine.snapshot.stats
                return stats.arrivals == arrived + 2 and stats.residents == 2

            await wait_for_async(both_resident, "the two long requests to fill B = 2", 120)
            short = [one(p, n) for p, n in zip(PROMPTS[2:], LENGTHS[2:], strict=True)]
            return list(await asyncio.gather(*long, *short))

    return asyncio.run(run())


def test_cached_prefixes_under_pausing_decode_the_uncached_text(worker_factory: Factory) -> None:
    """Also with speculative decoding (issue 37): drafts verified over cached blocks and
    across pauses and resumes leave every greedy text as it was, whether prompt lookup
    or the model's first 24 layers (whose KV pausing keeps in place) drafted them."""
    cached = worker_factory(**WORKER)
    with_cache = _overload(cached)
    with cached.client() as client:
        wait_for(lambda: client.get("/stats").json()["pauses_total"] > 0, "a pause counted", 30)
    # 36 requests share one full block (16 tokens). The first computes it; the requests
    # admitted in the same pass as it (at most B + H = 4) can miss; every later one hits.
    assert metric(cached.url, "vllm:prefix_cache_hits_total") >= 16 * (36 - 4)
    uncached = worker_factory(enable_prefix_caching=False, **WORKER)
    without = _overload(uncached)
    assert metric(uncached.url, "vllm:prefix_cache_hits_total") == 0
    assert with_cache == without
    for spec in (SPEC, EARLY_EXIT):
        drafting = worker_factory(speculative_config=spec, **WORKER)
        assert _overload(drafting) == without, spec["method"]
        assert metric(drafting.url, "genpool_pauses_total") > 0
        assert metric(drafting.url, "vllm:spec_decode_num_accepted_tokens_total") > 0


class DecodeBatches:
    """The network, recording the batch size of every decode that ran (not raised)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.sizes: list[int] = []

    def decode(self, cache: Any, tables: Any, tokens: list[int], positions: list[int]) -> Any:
        logits = self._model.decode(cache, tables, tokens, positions)
        self.sizes.append(len(tables))
        return logits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def test_requests_sharing_cached_blocks_decode_in_one_batch(worker_factory: Factory) -> None:
    """Rows that read the same cached prefix blocks are one decode batch: the block-table
    check refuses only a row writing into a block another row holds. (It refused any
    shared block, and every step fell back to one forward per row: about 7x slower at
    batch 8 on SmolLM2.)"""
    models: list[DecodeBatches] = []

    def wrap(model: Any) -> DecodeBatches:
        models.append(DecodeBatches(model))
        return models[0]

    worker = worker_factory(wrap_model=wrap, **{**WORKER, "max_batch_size": 4})

    async def run() -> list[str]:
        async with worker.async_client() as client:
            # The shared block cached first: all four find it, whether they arrive in one
            # pass or several (admitted in one pass, none would find another's blocks).
            await complete(client, SHARED + "Hi", 1)
            # 32 tokens each: long enough that all four are decoding at once on a slow day
            return await asyncio.gather(*(complete(client, p, 32) for p in PROMPTS))

    asyncio.run(run())
    assert metric(worker.url, "vllm:prefix_cache_hits_total") >= 4 * 16  # they share a block
    assert max(models[0].sizes) == 4, models[0].sizes
