"""Tensor-parallel shards (docs/design.md#multi-rank) reproduce the single-rank model.

Two gloo ranks on the CPU run the tiny random model sharded by heads and MLP
columns; every rank's logits must equal the unsharded model's (up to the
all-reduce's summation order).
"""

from __future__ import annotations

import pytest
import torch

from genpool_worker.model import LlamaModel
from tests.model.gloo_ranks import spawn_gloo_ranks
from tests.model.test_model_units import CFG, _weights

WORLD = 2


def _rank_main(rank: int, world: int) -> None:
    ref = LlamaModel(CFG, _weights(), num_slots=3, max_seq_len=16)
    shard = LlamaModel(CFG, _weights(), num_slots=3, max_seq_len=16, tp_rank=rank, tp_size=world)
    assert shard.kv_cache.k[0].shape[1] == CFG.num_kv_heads // world
    for model in (ref, shard):
        model.prefill(1, [4, 8, 15, 16])
    a, b = [5, 9, 3, 17, 22, 8], [30, 31]
    torch.testing.assert_close(shard.prefill(0, a), ref.prefill(0, a))
    torch.testing.assert_close(shard.prefill(2, b), ref.prefill(2, b))
    args = ([2, 0, 3], [7, 11, 0], [2, 6, 0])  # scattered slots + a dummy pad row
    torch.testing.assert_close(shard.decode(*args), ref.decode(*args))
    args = ([1, 2], [23, 5], [4, 3])
    torch.testing.assert_close(shard.decode(*args), ref.decode(*args))


def test_two_gloo_ranks_match_the_single_rank_model() -> None:
    spawn_gloo_ranks(_rank_main, WORLD)


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
        LlamaModel(CFG, _weights(), num_slots=1, max_seq_len=8, tp_rank=rank, tp_size=size)
