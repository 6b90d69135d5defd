"""Tensor-parallel shards of HF checkpoints reproduce the single-rank model.

Two gloo ranks on the CPU load the same checkpoint directory, each keeping its
slice of the heads and MLP columns; biases are sliced with their rows (Q/K/V) or
added once (the O projection's, after the all-reduce). Every rank's logits must
equal the unsharded model's, up to the all-reduce's summation order.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from genpool_worker.model import LlamaModel
from tests.model.hf_checkpoints import make_checkpoint

pytest.importorskip("transformers")
WORLD = 2


def _rank_main(rank: int, world: int, port: int, directory: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
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
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("arch", ["llama3", "qwen2"])
def test_two_gloo_ranks_match_the_single_rank_model(tmp_path: Path, arch: str) -> None:
    make_checkpoint(tmp_path, arch)
    spawn: Any = mp.spawn  # type: ignore[attr-defined]
    spawn(_rank_main, args=(WORLD, _free_port(), str(tmp_path)), nprocs=WORLD, join=True)
