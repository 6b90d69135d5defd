"""Tensor-parallel GEN workers: N ranks in one pod, rank-identical scheduling.

See docs/design.md#multi-rank.

Rank 0 owns the HTTP server, the admission inputs and the clock. Every pass it
broadcasts one :class:`PassInputs` (``now``, the previous step's end, new arrivals,
aborts, config updates); every rank applies it to its own scheduler, so all ranks
plan the identical batch with no other collective for scheduling. The model's
all-reduces are the only other communication.

Failure: a rank that dies takes the worker down. Rank 0 watches its followers and
exits non-zero (readiness goes false first); followers watch rank 0 and exit when it
is gone; the process group's timeout bounds any collective that would otherwise wait
on a dead peer.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from genpool_worker.engine_io import PassInputs

log = logging.getLogger("genpool.worker")
COLLECTIVE_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 0.2


class DistCoordinator:
    """Broadcasts rank 0's pass inputs to every rank (gloo on CPU, NCCL on GPU)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def exchange(self, inputs: PassInputs | None) -> PassInputs:
        box: list[Any] = [inputs]
        dist.broadcast_object_list(box, src=0)
        result = box[0]
        assert isinstance(result, PassInputs)
        return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_process_group(rank: int, world_size: int, port: int, backend: str = "gloo") -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )


def close_process_group() -> None:
    """Leave the process group before the interpreter exits: a group destroyed at exit
    with its transport threads still joinable aborts the process (SIGABRT, "terminate
    called without an active exception"). The barrier lets every rank finish reading
    the last broadcast first; a peer already gone only costs the collective timeout."""
    if not dist.is_initialized():
        return
    try:
        dist.barrier()
    except RuntimeError as exc:  # a dead peer: nothing left to wait for
        log.warning("process group barrier at exit failed: %s", exc)
    dist.destroy_process_group()


def spawn_followers(
    world_size: int, port: int, target: Callable[..., None], args: tuple[Any, ...]
) -> list[multiprocessing.process.BaseProcess]:
    """Start ranks 1..N-1 (spawned, so no torch state is inherited)."""
    context = multiprocessing.get_context("spawn")
    processes: list[multiprocessing.process.BaseProcess] = []
    for rank in range(1, world_size):
        process = context.Process(
            target=target, args=(rank, world_size, port, os.getpid(), *args), daemon=True
        )
        process.start()
        processes.append(process)
    return processes


def watch_followers(
    processes: list[multiprocessing.process.BaseProcess], on_death: Callable[[int, int], None]
) -> threading.Thread:
    """Rank 0: call ``on_death(rank, exitcode)`` as soon as a follower is gone."""

    def watch() -> None:
        while True:
            for rank, process in enumerate(processes, start=1):
                if not process.is_alive():
                    on_death(rank, process.exitcode or -1)
                    return
            time.sleep(WATCH_INTERVAL_S)

    thread = threading.Thread(target=watch, name="genpool-rank-watch", daemon=True)
    thread.start()
    return thread


def watch_leader(leader_pid: int) -> threading.Thread:
    """Ranks > 0: exit when rank 0's process is gone (never wait on a dead leader)."""

    def watch() -> None:
        while True:
            try:
                os.kill(leader_pid, 0)
            except ProcessLookupError:
                log.error("rank 0 (pid %d) is gone; exiting", leader_pid)
                os._exit(3)
            if os.getppid() != leader_pid:
                os._exit(3)
            time.sleep(WATCH_INTERVAL_S)

    thread = threading.Thread(target=watch, name="genpool-leader-watch", daemon=True)
    thread.start()
    return thread
