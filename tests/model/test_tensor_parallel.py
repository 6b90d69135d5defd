"""Tensor-parallel shards (docs/design.md#multi-rank) reproduce the single-rank model.

Two gloo ranks on the CPU run a model sharded by heads and MLP columns, over scattered
block tables (tests/model/paged.py) that both ranks build alike (the schedulers of a
real pool agree the same way). The tiny random model's logits must equal the unsharded
model's (up to the all-reduce's summation order); the SmolLM2 GGUF's greedy tokens, with
requests paused and resumed, must equal transformers'. SmolLM2-135M has 9 query and 3 KV
heads, so it shards 3 ways (2 divides neither); the HF checkpoints of
test_hf_tensor_parallel.py cover 2 ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from genpool_worker.model import LlamaConfig, LlamaModel
from genpool_worker.model.kv_sizing import bytes_per_block
from tests.model.conftest import BLOCK_SIZE, MAX_SEQ_LEN, NEW_TOKENS, NUM_BLOCKS
from tests.model.gloo_ranks import spawn_gloo_ranks
from tests.model.paged import BlockPool, interleaved_tables, llama_runner, run_with_pauses
from tests.model.test_model_units import CFG, _weights

WORLD = 2
GGUF_WORLD = 3
SIZES: dict[str, Any] = {"num_blocks": 9, "block_size": 5, "max_seq_len": 16}


def _rank_main(rank: int, world: int) -> None:
    ref = llama_runner(LlamaModel, CFG, _weights(), **SIZES)
    shard = llama_runner(LlamaModel, CFG, _weights(), **SIZES, tp_rank=rank, tp_size=world)
    assert shard.kv.cache.k[0].shape == (CFG.num_kv_heads // world, 10, 5, CFG.head_dim)
    assert shard.kv.kv_layout() is None  # P/D moves one rank's KV: not under TP
    c, a, b = [4, 8, 15, 16, 23, 12], [5, 9, 3, 17, 22, 8, 13], [30, 31]
    tc, ta, tb = interleaved_tables(9, 5, [len(c) + 1, len(a) + 1, len(b) + 2])
    for model in (ref, shard):
        model.prefill(tc, c)
    torch.testing.assert_close(shard.prefill(ta, a), ref.prefill(ta, a))
    torch.testing.assert_close(shard.prefill(tb, b), ref.prefill(tb, b))
    args = ([tb, ta, [ref.kv.dummy_block]], [7, 11, 0], [2, 7, 0])  # + a dummy pad row
    torch.testing.assert_close(shard.decode(*args), ref.decode(*args))
    args = ([tc, tb], [23, 5], [6, 3])
    torch.testing.assert_close(shard.decode(*args), ref.decode(*args))

    # A rank's block holds its own KV heads only, so a byte budget buys twice the blocks
    # at 2 ranks (one of them the padding block); every rank takes the smallest count
    # (here rank 0's).
    full = bytes_per_block(CFG, 5, CFG.num_kv_heads, torch.float32)
    sized = llama_runner(
        LlamaModel,
        CFG,
        _weights(),
        kv_cache_memory=(7 + 2 * rank) * full,
        block_size=5,
        max_seq_len=16,
        tp_rank=rank,
        tp_size=world,
    )
    assert sized.kv.num_blocks == 7 * world - 1


def test_two_gloo_ranks_match_the_single_rank_model() -> None:
    spawn_gloo_ranks(_rank_main, WORLD)


def _gguf_rank(
    rank: int,
    world: int,
    config: LlamaConfig,
    weights_file: str,
    prompts: list[list[int]],
    refs: list[list[int]],
) -> None:
    weights = torch.load(weights_file, mmap=True, weights_only=True)
    shard = llama_runner(
        LlamaModel,
        config,
        weights,
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        max_seq_len=MAX_SEQ_LEN,
        tp_rank=rank,
        tp_size=world,
        consume_weights=True,
    )
    out, log = run_with_pauses(shard, BlockPool.of(shard, seed=4), prompts, NEW_TOKENS)
    assert log.grown
    assert out == refs, rank


def test_gguf_three_gloo_ranks_greedy_with_pauses_equals_transformers(
    gguf_weights: tuple[LlamaConfig, Any],
    gguf_weights_file: Path,
    chat_refs: list[tuple[list[int], list[int]]],
) -> None:
    prompts, refs = [ids for ids, _ in chat_refs], [ref for _, ref in chat_refs]
    config = gguf_weights[0]
    spawn_gloo_ranks(_gguf_rank, GGUF_WORLD, config, str(gguf_weights_file), prompts, refs)


@pytest.mark.parametrize(
    ("rank", "size", "match"),
    [
        (0, 3, "must divide the model's num_heads=4"),
        (2, 2, "0 <= tp_rank < tp_size"),
        (0, 0, "0 <= tp_rank < tp_size"),
        (1, 2, "needs torch.distributed initialised"),
    ],
)
def test_tensor_parallel_settings_are_checked(rank: int, size: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LlamaModel(CFG, _weights(), max_seq_len=8, tp_rank=rank, tp_size=size)
