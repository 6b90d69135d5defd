"""Decode timing shared by the model benchmarks (worker, cpu_decode, gpu_check).

Ours: prefill each request into its block table (untimed), then batched greedy
``decode`` steps, timed, argmax and ``.tolist()`` included. transformers: ``generate``
greedy with ``min_new_tokens = max_new_tokens``, so exactly ``new`` tokens come back.

Block tables: ``running_pool_tables`` gives them as the worker's pool would after a while
of traffic (``genpool_core.kv_blocks``: reserved whole, lowest free ids first, freed in
whatever order requests finish), so they are fragmented and interleaved;
``static_tables`` gives the pre-paging layout (one ``max_seq_len`` block per request,
consecutive), which the CPU decode reads in place.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from genpool_core.kv_blocks import BlockPool, KVBudget
from genpool_worker.model import CacheEngine, KVCache, KVSizing, LlamaModel
from genpool_worker.model_runner import TorchModelRunner

Tables = Sequence[Sequence[int]]


@dataclass(frozen=True)
class Ours:
    """Our network, the KV cache the worker's runner owns for it, and that runner, whose
    ``prefill``/``decode`` run the passes as the worker does (decode replayed from the
    cache's CUDA graphs on CUDA)."""

    model: LlamaModel
    kv: CacheEngine
    runner: TorchModelRunner[KVCache]

    @classmethod
    def of(cls, model: LlamaModel, kv: CacheEngine) -> Ours:
        return cls(model, kv, TorchModelRunner(model, kv))

    @classmethod
    def with_blocks(
        cls,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        *,
        in_place_decode: bool | None = None,
    ) -> Ours:
        """``model`` over a cache of exactly ``num_blocks`` blocks of ``block_size``
        (``in_place_decode``: ``CacheEngine``'s)."""
        sizing = KVSizing(block_size, num_blocks)
        return cls.of(model, CacheEngine(model, sizing, in_place_decode=in_place_decode))


def running_pool_tables(
    num_blocks: int, block_size: int, tokens: int, rows: int, seed: int
) -> list[list[int]]:
    """``rows`` tables of ``tokens`` tokens each, allocated from a pool of ``num_blocks``
    after seeded churn: requests of random sizes fill it, a random half of them finish,
    and so on until the bench's requests are admitted into the holes left."""
    rng = random.Random(seed)
    pool = BlockPool(KVBudget(num_blocks, block_size))
    need = pool.budget.blocks_for(tokens)
    if rows * need > num_blocks:
        raise ValueError(f"{rows} requests of {need} blocks do not fit {num_blocks}")
    held: list[list[int]] = []
    for _ in range(4):  # rounds of admissions until full, then half the requests finish
        while True:
            size = rng.randint(1, 2 * need)
            if not pool.can_allocate(size):
                break
            held.append(pool.allocate(size))
        rng.shuffle(held)
        for blocks in held[: len(held) // 2]:
            pool.free(blocks)
        held = held[len(held) // 2 :]
    tables: list[list[int]] = []
    while len(tables) < rows:
        if pool.can_allocate(need):
            tables.append(list(pool.allocate(need)))
        else:  # the oldest survivor finishes, making room
            pool.free(held.pop(0))
    return tables


def static_tables(rows: int, first: int = 0) -> list[list[int]]:
    """The pre-paging layout: request ``i`` in block ``first + i`` (of ``max_seq_len``)."""
    return [[first + i] for i in range(rows)]


def hf_generate(hf: Any, ids: torch.Tensor, new: int, pad_id: int = 0, **options: Any) -> Any:
    """transformers' greedy ``generate`` of exactly ``new`` tokens: the new tokens only."""
    with torch.inference_mode():
        out = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            **options,
            pad_token_id=pad_id,
        )
    return out[:, ids.shape[1] :]


def time_hf(
    hf: Any, prompts: list[list[int]], new: int, pad_id: int = 0
) -> tuple[float, list[list[int]]]:
    """Seconds of one ``hf_generate`` call on ``prompts`` (no padding), and its tokens."""
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    tokens = hf_generate(hf, ids, new, pad_id)
    seconds = time.perf_counter() - start
    return seconds, tokens.tolist()


def time_ours(
    ours: Ours, prompts: list[list[int]], tables: Tables, steps: int
) -> tuple[float, list[list[int]]]:
    """Prefill each prompt into its block table (untimed), then ``steps`` greedy decode
    steps: their seconds, and each request's tokens (the prefill's first one included)."""
    run = ours.runner
    tokens = [int(run.prefill(t, p).argmax()) for t, p in zip(tables, prompts, strict=True)]
    positions = [len(p) for p in prompts]
    out = [[t] for t in tokens]
    start = time.perf_counter()
    for i in range(steps):
        tokens = run.decode(tables, tokens, [p + i for p in positions]).argmax(-1).tolist()
        for seq, t in zip(out, tokens, strict=True):
            seq.append(t)
    return time.perf_counter() - start, out
