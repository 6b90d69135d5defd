"""Run a function on several gloo ranks on the CPU (the tensor-parallel tests' launcher).

``spawn_gloo_ranks(fn, world, *args)`` starts ``world`` processes; each joins a gloo
process group on a free local port and calls ``fn(rank, world, *args)``. ``fn`` must be a
module-level function (the spawned processes unpickle it by name).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _gloo_rank(rank: int, fn: Callable[..., None], world: int, port: int, *args: object) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn_gloo_ranks(fn: Callable[..., None], world: int, *args: object) -> None:
    spawn: Any = mp.spawn  # type: ignore[attr-defined]
    spawn(_gloo_rank, args=(fn, world, _free_port(), *args), nprocs=world, join=True)
