"""Tensor-parallel shards of HF checkpoints reproduce the single-rank model.

Two gloo ranks on the CPU load the same checkpoint directory, each keeping its
slice of the heads and MLP columns; biases are sliced with their rows (Q/K/V) or
added once (the O projection's, after the all-reduce). Every rank's logits must
equal the unsharded model's, up to the all-reduce's summation order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genpool_worker.model import LlamaModel
from tests.model.gloo_ranks import spawn_gloo_ranks
from tests.model.hf_checkpoints import make_checkpoint

pytest.importorskip("transformers")
WORLD = 2


def _rank_main(rank: int, world: int, directory: str) -> None:
    ref = LlamaModel.from_hf_dir(directory, num_slots=3, max_seq_len=32)
    shard = LlamaModel.from_hf_dir(
        directory, num_slots=3, max_seq_len=32, tp_rank=rank, tp_size=world
    )
    assert shard.kv_cache.k[0].shape[1] == ref.kv_cache.k[0].shape[1] // world
    a, b = [1, 5, 9, 17, 22, 8], [30, 31]
    torch.testing.assert_close(shard.prefill(0, a), ref.prefill(0, a))
    torch.testing.assert_close(shard.prefill(2, b), ref.prefill(2, b))
    args = ([2, 0, 3], [7, 11, 0], [2, 6, 0])  # scattered slots + a dummy pad row
    torch.testing.assert_close(shard.decode(*args), ref.decode(*args))


@pytest.mark.parametrize("arch", ["llama3", "qwen2"])
def test_two_gloo_ranks_match_the_single_rank_model(tmp_path: Path, arch: str) -> None:
    make_checkpoint(tmp_path, arch)
    spawn_gloo_ranks(_rank_main, WORLD, str(tmp_path))
