"""Multi-rank workers: identical plans on every rank, same tokens as one rank, and a
dead rank takes the worker down (docs/design.md#multi-rank)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from functools import partial

import httpx
import pytest

from genpool_worker.multirank import free_port
from genpool_worker.worker_config import check_tensor_parallel_size
from tests.polling import wait_for
from tests.worker.multirank_harness import run_rank

SYNTHETIC = "synthetic:tp"


def run_world(
    world_size: int, model: str
) -> list[tuple[int, list[str], dict[str, list[int]], int, object]]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=run_rank, args=(rank, world_size, port, model, results))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    out = [results.get(timeout=900) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    return sorted(out, key=lambda r: r[0])


def check_identical(model: str, *, against_one_rank: bool = True) -> None:
    ranks = run_world(3, model)
    digests = [r[1] for r in ranks]
    assert all(r[4] is None for r in ranks), [r[4] for r in ranks]
    assert len(digests[0]) > 50
    assert digests[0] == digests[1] == digests[2]  # every pass planned identically
    assert ranks[0][3] > 0, "the run must pause and resume requests"
    assert ranks[0][2] == ranks[1][2] == ranks[2][2]
    if against_one_rank:
        single = run_world(1, model)[0]
        assert ranks[0][2] == single[2]  # the same tokens as one rank, request by request


def test_three_ranks_plan_identically_and_match_one_rank_synthetic() -> None:
    check_identical(SYNTHETIC)


def test_three_ranks_of_smollm2_plan_identically() -> None:
    """Sharded by heads and MLP columns, through the engine: every rank plans every pass
    alike and emits the same tokens. That the sharded model's greedy tokens are one
    rank's, with pauses, is the model tier's (tests/model/test_tensor_parallel.py, against
    transformers): a fourth SmolLM2 run here cost about 25 s of the suite's budget."""
    check_identical("smollm2-135m", against_one_rank=False)


def test_unsupported_tensor_parallel_sizes_are_rejected() -> None:
    check_tensor_parallel_size("smollm2-135m", 1)
    check_tensor_parallel_size("smollm2-135m", 3)
    check_tensor_parallel_size("/models/Llama-3.1-8B-Instruct", 8)
    check_tensor_parallel_size("/models/unknown-checkpoint", 5)  # checked when weights load
    for size in (0, 2, 4, 9):
        with pytest.raises(ValueError, match="must divide"):
            check_tensor_parallel_size("smollm2-135m", size)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", "spawn_main"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    return [int(p) for p in out.stdout.split()]


def _is_running(pid: int) -> bool:
    """Alive and not a zombie (orphans may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _is_gone(pid: int) -> bool:
    return not _is_running(pid)


def test_a_dead_rank_takes_the_worker_down_quickly() -> None:
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "genpool_worker.worker_cli", "--model", SYNTHETIC,
         "--tensor-parallel-size", "3", "--port", str(port), "--synthetic-time-scale", "0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def ready() -> bool:
        assert worker.poll() is None, f"the worker exited with {worker.returncode}"
        with contextlib.suppress(httpx.TransportError):  # not listening yet
            return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200
        return False

    try:
        wait_for(ready, "the worker's /ready to answer 200", 60, interval=0.2)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                           json={"prompt": "hi", "max_tokens": 4}, timeout=30)  # fmt: skip
        assert reply.status_code == 200
        followers = _children(worker.pid)
        assert len(followers) == 2
        os.kill(followers[0], signal.SIGKILL)
        started = time.monotonic()
        code = worker.wait(timeout=30)
        assert code != 0 and time.monotonic() - started < 15
        for pid in followers[1:]:  # the surviving rank does not linger
            wait_for(partial(_is_gone, pid), f"rank process {pid} to exit with the worker", 10,
                     interval=0.1)  # fmt: skip
    finally:
        if worker.poll() is None:
            worker.kill()
