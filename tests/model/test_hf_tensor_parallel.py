"""Tensor-parallel shards of HF checkpoints reproduce the single-rank model.

Two gloo ranks on the CPU load the same checkpoint directory, each keeping its
slice of the heads and MLP columns; biases are sliced with their rows (Q/K/V) or
added once (the O projection's, after the all-reduce). Every rank's logits must
equal the unsharded model's, up to the all-reduce's summation order, and its greedy
tokens, generated with requests paused and resumed over scattered blocks of 5
(tests/model/paged.py), transformers'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from genpool_worker.model import LlamaModel
from tests.model.gloo_ranks import spawn_gloo_ranks
from tests.model.hf_checkpoints import (
    PROMPTS,
    SCHEDULE_TOKENS,
    make_checkpoint,
    transformers_greedy,
)
from tests.model.paged import BlockPool, interleaved_tables, llama_runner, run_with_pauses
from tests.model.scheduled import EARLY_EXIT, NGRAM, scheduled_greedy, speculating

pytest.importorskip("transformers")
WORLD = 2
SIZES: dict[str, Any] = {"num_blocks": 3 * 64 // 5, "block_size": 5, "max_seq_len": 64}


def _rank_main(rank: int, world: int, directory: str, refs: list[list[int]]) -> None:
    ref = llama_runner(LlamaModel.from_hf_dir, directory, **SIZES)
    shard = llama_runner(LlamaModel.from_hf_dir, directory, **SIZES, tp_rank=rank, tp_size=world)
    assert shard.kv.cache.k[0].shape[0] == ref.kv.cache.k[0].shape[0] // world
    a, b = [1, 5, 9, 17, 22, 8], [30, 31]
    ta, tb = interleaved_tables(ref.kv.num_blocks, 5, [len(a) + 1, len(b) + 1])
    torch.testing.assert_close(shard.prefill(ta, a), ref.prefill(ta, a))
    torch.testing.assert_close(shard.prefill(tb, b), ref.prefill(tb, b))
    args = ([tb, ta, [ref.kv.dummy_block]], [7, 11, 0], [2, 6, 0])  # + a dummy pad row
    torch.testing.assert_close(shard.decode(*args), ref.decode(*args))
    out, _ = run_with_pauses(shard, BlockPool.of(shard, seed=5), PROMPTS, SCHEDULE_TOKENS)
    assert out == refs, rank
    # Drafted and verified on every rank alike (n-gram drafts need no exchange; early
    # exit's argmax reads logits that are whole on every rank): every pass's plan, the
    # drafts it states included, equals the single-rank run's.
    for drafter in (NGRAM, EARLY_EXIT):
        plans: list[str] = []
        drafted, num_drafts = scheduled_greedy(speculating(shard, drafter), PROMPTS,
                                               SCHEDULE_TOKENS, digests=plans)  # fmt: skip
        assert drafted == refs and num_drafts > 0, (rank, drafter.method)
        single: list[str] = []
        scheduled_greedy(speculating(ref, drafter), PROMPTS, SCHEDULE_TOKENS, digests=single)
        assert plans == single, (rank, drafter.method)


# smollm2: the SmolLM2-style tied checkpoint, as the GGUF (9 heads) cannot shard 2 ways.
@pytest.mark.parametrize("arch", ["llama3", "mistral", "qwen2", "smollm2"])
def test_two_gloo_ranks_match_the_single_rank_model(tmp_path: Path, arch: str) -> None:
    hf = make_checkpoint(tmp_path, arch)
    refs = transformers_greedy(hf, PROMPTS, SCHEDULE_TOKENS)
    spawn_gloo_ranks(_rank_main, WORLD, str(tmp_path), refs)
