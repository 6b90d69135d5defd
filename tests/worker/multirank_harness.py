"""Runs one rank of a scripted multi-rank worker (no HTTP); imported by spawned ranks."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.multirank import DistCoordinator, close_process_group, init_process_group
from genpool_worker.worker_cli import WorkerConfig, build_runner, build_scheduler
from tests.polling import wait_for
from tests.worker.recording import PlanRecorder

SETTINGS: dict[str, Any] = {
    "max_batch_size": 2,
    "preemption_mode": "target_output_tps",
    "target_output_tps": 5.0,
    "paused_cap": 2,
    "resident_headroom": 2,
    "stat_interval_s": 0.5,
    # X <= slack_s: a keyed waiter is at risk as soon as it waits, so the overload
    # below pauses whatever the machine's speed (the test must not depend on timing).
    "admission_target_max_s": 0.5,
    "synthetic_time_scale": 0.05,
    "max_seq_len": 256,
}
# A long run's hysteresis is 2 % of its span (max_tokens / T): it finishes past it only
# if it decodes slower than T / 0.02 tok/s. Synthetic steps are ~3 ms, so T = 5 put that
# bound (250 tok/s) at the synthetic speed itself and a fast moment paused nothing; at
# T = 50 the bound is 2500 tok/s. Slower runs become below-target victims: both pause.
SYNTHETIC_TARGET_OUTPUT_TPS = 50.0
PROMPTS = ["The capital of France is", "One, two, three,", "Water boils at", "def add(a, b):"]


def script(long_tokens: int) -> list[tuple[float, str, list[int] | str, int]]:
    """(delay before, id, prompt, max_tokens): warm-up, then an overload that pauses."""
    steps: list[tuple[float, str, list[int] | str, int]] = [
        (0.0, f"w{i}", PROMPTS[i % 4], 1) for i in range(34)
    ]
    steps += [(0.1, "long0", PROMPTS[0], long_tokens), (0.0, "long1", PROMPTS[1], long_tokens)]
    steps += [(0.05, f"s{i}", PROMPTS[(i + 2) % 4], 8) for i in range(6)]
    return steps


def drive(engine: GenEngine, recorder: PlanRecorder, tokenizer: Any, long_tokens: int) -> None:
    expected = 0
    for delay, request_id, prompt, max_tokens in script(long_tokens):
        time.sleep(delay)  # the script's spacing of arrivals: the load's shape, not a wait
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        arrival = Arrival(request_id, ids, max_tokens, arrival_time=time.time())
        engine.submit(EngineRequest(arrival))
        expected += 1
        if request_id == "w33":  # let the warm-up finish so X is initialised
            wait_for(lambda: len(recorder.completed) >= 34, "the 34 warm-up requests", 300,
                     interval=0.01)  # fmt: skip
    wait_for(lambda: len(recorder.completed) >= expected, f"all {expected} requests", 600,
             interval=0.02)  # fmt: skip


def run_rank(
    rank: int,
    world_size: int,
    port: int,
    model: str,
    results: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    settings = {**SETTINGS, "model": model, "tensor_parallel_size": world_size}
    if model.startswith("synthetic"):
        settings["target_output_tps"] = SYNTHETIC_TARGET_OUTPUT_TPS
    config = WorkerConfig.model_validate(settings)
    if world_size > 1:
        init_process_group(rank, world_size, port)
    pool_size = build_scheduler(config).slots.pool_size
    runner, tokenizer, scheduler = build_runner(config, pool_size, tp_rank=rank)
    coordinator = DistCoordinator(rank) if world_size > 1 else None
    recorder = PlanRecorder()
    engine = GenEngine(runner, tokenizer, scheduler, coordinator=coordinator, observer=recorder)
    failure: BaseException | None = None
    if rank == 0:
        engine.start()
        try:
            drive(engine, recorder, tokenizer, 120 if runner.info.is_synthetic else 20)
        except AssertionError as exc:  # a wait timed out: stop cleanly, then report it
            failure = exc
        engine.stop(timeout=60)
    else:
        engine.run()
    stats = scheduler.make_stats(0.0)
    error = engine.error or failure
    results.put((rank, recorder.plan_digests, recorder.completed, stats.pauses, error))
    if world_size > 1:
        close_process_group()
