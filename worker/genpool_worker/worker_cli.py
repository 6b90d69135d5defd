"""``genpool-worker``: one GEN worker process (model + engine + HTTP API)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from genpool_core.kv_blocks import KVBudget
from genpool_core.preemption import GenPreemptionConfigError
from genpool_core.scheduler import GenScheduler
from genpool_core.worker_env import ADMIN_TOKEN_ENV
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Tokenizer
from genpool_worker.kv_events import KVEventsSocketError, start_kv_events
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.serving import ServerProcess, drain_timeout_s, read_kv_secret
from genpool_worker.speculative import DrafterModelError
from genpool_worker.termination_log import report_fatal
from genpool_worker.worker_args import ConfigEnvError, build_parser, config_from_env, parse_config
from genpool_worker.worker_config import (
    SYNTHETIC_PREFIX,
    MaxSeqLenError,
    WorkerConfig,
    build_scheduler,
    resolve_max_seq_len,
)

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from genpool_worker.engine_io import Coordinator
    from genpool_worker.kv_edge import KVTransferParts
    from genpool_worker.model_runner import TorchModelRunner

log = logging.getLogger("genpool.worker")
RANK_DEATH_GRACE_S = 1.0
MAX_TRACEBACK_CHARS = 3000


def torch_threads(tensor_parallel_size: int) -> int:
    """Threads per rank: ``OMP_NUM_THREADS`` when set (several pods sharing a host
    without CPU limits, as on the devcluster), else the cores split among the ranks,
    because oversubscribed torch threads collapse throughput."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (os.cpu_count() or 1) // tensor_parallel_size)


def default_num_blocks(config: WorkerConfig, num_slots: int, max_seq_len: int) -> int | None:
    """Blocks when no budget is given: off CUDA, room for ``num_slots`` requests of
    ``max_seq_len`` (the memory the static slot cache took); on CUDA None (the GPU share)."""
    if config.kv_cache_memory is not None or config.gpu_memory_utilization is not None:
        return None
    if config.device.startswith("cuda"):
        return None
    return num_slots * -(-max_seq_len // config.kv_block_size)


def model_max_seq_len(config: WorkerConfig) -> int:
    """``--max-seq-len`` against the model's own context, read from its ``config.json``
    or GGUF header before any weight (``resolve_max_seq_len``: unset is that context,
    capped; a larger value is a ``MaxSeqLenError``)."""
    if config.model.startswith(SYNTHETIC_PREFIX):
        return resolve_max_seq_len(config.max_seq_len, None)
    from genpool_worker.model.gguf_weights import find_smollm2_gguf, gguf_context
    from genpool_worker.model.hf_config import hf_context

    path = find_smollm2_gguf() if config.model == "smollm2-135m" else Path(config.model)
    context = hf_context(path) if path.is_dir() else gguf_context(path)
    return resolve_max_seq_len(config.max_seq_len, context, config.device)


def build_model(
    config: WorkerConfig, num_slots: int, tp_rank: int = 0
) -> tuple[TorchModelRunner[Any], Tokenizer]:
    """The network (this rank's shard) and its KV cache behind a runner, and the
    tokenizer; ``num_slots`` (B + max headroom) sizes the default cache."""
    from genpool_worker.model_runner import TorchModelRunner

    max_seq_len = model_max_seq_len(config)
    num_blocks = default_num_blocks(config, num_slots, max_seq_len)
    if config.model.startswith(SYNTHETIC_PREFIX):
        from genpool_worker.synthetic import SyntheticKVCache, SyntheticModel, SyntheticTokenizer

        synthetic = SyntheticModel(
            config.model.split(":", 1)[1] or "default",
            max_seq_len=max_seq_len,
            time_scale=config.synthetic_time_scale,
        )
        blocks = num_blocks or synthetic_num_blocks(config, max_seq_len)
        cache = SyntheticKVCache(synthetic.name, num_blocks=blocks,
                                 block_size=config.kv_block_size)  # fmt: skip
        return TorchModelRunner(synthetic, cache, config.speculative()), SyntheticTokenizer()
    import torch

    from genpool_worker.model.cache_engine import CacheEngine
    from genpool_worker.model.gguf_weights import find_smollm2_gguf
    from genpool_worker.model.kv_sizing import KVSizing
    from genpool_worker.model.llama import LlamaModel
    from genpool_worker.model.tokenizer import load_tokenizer

    sizing = KVSizing(config.kv_block_size, num_blocks, config.kv_cache_memory,
                      config.gpu_memory_utilization)  # fmt: skip
    torch.set_num_threads(torch_threads(config.tensor_parallel_size))
    path = find_smollm2_gguf() if config.model == "smollm2-135m" else config.model
    llama = LlamaModel.load(  # a GGUF file or a Hugging Face checkpoint directory
        path, max_seq_len=max_seq_len, device=config.device,
        tp_rank=tp_rank, tp_size=config.tensor_parallel_size,
    )  # fmt: skip
    engine = CacheEngine(llama, sizing, max_decode_batch=config.max_batch_size)
    return TorchModelRunner(llama, engine, config.speculative()), load_tokenizer(path)


def synthetic_num_blocks(config: WorkerConfig, max_seq_len: int) -> int:
    """A synthetic model's blocks from ``--kv-cache-memory`` at a nominal KV size per
    token (it has no weights); too small for one ``max_seq_len`` request is refused."""
    from genpool_worker.synthetic import SYNTHETIC_KV_BYTES_PER_TOKEN

    memory = config.kv_cache_memory or 0
    block_bytes = SYNTHETIC_KV_BYTES_PER_TOKEN * config.kv_block_size
    count = max(0, memory // block_bytes - 1)  # the dummy block is in the budget
    need = -(-max_seq_len // config.kv_block_size)
    if count < need:
        raise ValueError(
            f"--kv-cache-memory={memory} bytes holds {count} KV blocks of "
            f"{config.kv_block_size} tokens ({block_bytes} bytes each, synthetic); one request "
            f"of --max-seq-len={max_seq_len} needs {need}"
        )
    return count


def build_runner(
    config: WorkerConfig, num_slots: int, tp_rank: int = 0
) -> tuple[TorchModelRunner[Any], Tokenizer, GenScheduler]:
    """The model (this rank's shard) behind its runner, the tokenizer, and the scheduler
    with the KV budget the model's cache holds."""
    runner, tokenizer = build_model(config, num_slots, tp_rank)
    info = runner.info
    log.info(
        "KV cache: %d blocks of %d tokens (%d tokens)",
        info.num_kv_blocks, info.kv_block_size, info.num_kv_blocks * info.kv_block_size,
    )  # fmt: skip
    budget = KVBudget(info.num_kv_blocks, info.kv_block_size)
    return runner, tokenizer, build_scheduler(config, budget)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = parse_config(argv)
        scheduler = build_scheduler(config)
    except ValidationError as exc:
        return _config_error(_describe(error) for error in exc.errors())
    except (GenPreemptionConfigError, ConfigEnvError) as exc:
        return _config_error([str(exc)])
    try:
        return _run(config, scheduler)
    except (MaxSeqLenError, KVEventsSocketError, DrafterModelError) as exc:  # known once read
        return _config_error([str(exc)])
    except Exception as exc:  # model load, engine set-up: the cause goes to the pod's status
        log.exception("worker failed")
        report_fatal(f"{type(exc).__name__}: {exc}", _traceback_tail())
        return 1


def _config_error(problems: Iterable[str]) -> int:
    """Exit 2 on a configuration the worker refuses, each problem on stderr and the first
    as the termination message's cause."""
    lines = list(problems)
    for line in lines:
        print(f"genpool-worker: error: {line}", file=sys.stderr)
    report_fatal(f"invalid worker configuration: {lines[0]}", "\n".join(lines[1:]))
    return 2


def _describe(error: ErrorDetails) -> str:
    where = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _traceback_tail() -> str:
    # The end of a traceback names the failing call; the kubelet keeps only 4096 bytes.
    return traceback.format_exc()[-MAX_TRACEBACK_CHARS:]


def _run(config: WorkerConfig, scheduler: GenScheduler) -> int:
    from genpool_worker.pd.setup import PDSettings, build_pd

    log.info(scheduler.policy.enabled_line())
    followers, coordinator = _start_followers(config)
    runner, tokenizer, scheduler = build_runner(config, scheduler.slots.pool_size)
    info = runner.info
    if info.is_synthetic:
        log.info("model %s is SYNTHETIC: no weights, simulated step times", info.name)
    metrics = WorkerMetrics(info.name, info.is_synthetic)
    # P/D's parts over the runner's KV cache: its connector goes into the engine.
    settings = PDSettings.from_config(config, read_kv_secret(config, os.environ))
    kv_transfer = build_pd(runner, info, metrics, settings)
    engine = GenEngine(runner, tokenizer, scheduler, on_step=metrics.observe_step,
                       coordinator=coordinator, kv_connector=kv_transfer.connector)  # fmt: skip
    if followers:
        from genpool_worker.multirank import watch_followers

        watch_followers(followers, lambda rank, code: _rank_died(engine, rank, code))
    return _serve(engine, tokenizer, metrics, config, kv_transfer)


def _start_followers(
    config: WorkerConfig,
) -> tuple[list[BaseProcess], Coordinator | None]:
    """Ranks 1..N-1 and rank 0's coordinator; nothing (and no torch) for one rank."""
    world_size = config.tensor_parallel_size
    if world_size == 1:
        return [], None
    from genpool_worker.multirank import (
        DistCoordinator,
        free_port,
        init_process_group,
        spawn_followers,
    )

    port = free_port()
    followers = spawn_followers(world_size, port, follower_main, (config.model_dump(),))
    backend = "nccl" if config.device == "cuda" else "gloo"
    init_process_group(0, world_size, port, backend=backend)
    return followers, DistCoordinator(0)


def _serve(engine: GenEngine, tokenizer: Tokenizer, metrics: WorkerMetrics,
           config: WorkerConfig, kv_transfer: KVTransferParts) -> int:  # fmt: skip
    """Rank 0: the engine thread and the HTTP server until the server stops (SIGTERM, or
    the engine died)."""
    import uvicorn

    from genpool_worker.server import create_app

    app = create_app(
        engine,
        tokenizer,
        metrics,
        admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None,
        stamp_arrival=config.stamp_arrival,
        max_arrival_age_s=config.max_arrival_age_s,
        kv_transfer=kv_transfer,
        aliases=(config.model,),
    )
    http = uvicorn.Config(app, host=config.host, port=config.port, log_level="warning")
    server = ServerProcess(http, engine, drain_timeout_s(os.environ))
    # A dead loop fails every request at once (503) and readiness goes false; the process
    # then exits non-zero so the kubelet restarts it (docs/worker.md#engine-loop).
    engine.on_death = lambda exc: server.stop()
    # Rank 0 alone publishes: every rank's pool makes the same events.
    kv_events = start_kv_events(config.kv_events(), engine.model_info.kv_block_size, config.host)
    engine.kv_events = kv_events
    metrics.kv_events = kv_events
    # uvicorn re-raises a SIGTERM it handled once it has shut down, to the handler found
    # before it: this one lets the shutdown below (engine, ranks) run, then exit 0.
    signal.signal(signal.SIGTERM, lambda sig, frame: None)
    engine.start()
    try:
        server.run()
    finally:
        engine.stop()
        if kv_events is not None:
            kv_events.close()
    if engine.error:
        report_fatal(f"engine failed: {engine.error}")
        return 1
    if config.tensor_parallel_size > 1:  # the followers saw the stop: leave together
        from genpool_worker.multirank import close_process_group

        close_process_group()
    return 0


def _rank_died(engine: GenEngine, rank: int, exitcode: int) -> None:
    """A dead rank takes the worker down: readiness false at once, then exit non-zero."""
    engine.error = RuntimeError(f"rank {rank} exited with code {exitcode}")
    report_fatal(f"tensor-parallel {engine.error}")  # kept only if the rank wrote none
    log.error("rank %d exited with code %d: shutting the worker down", rank, exitcode)
    time.sleep(RANK_DEATH_GRACE_S)  # let probes see /ready and /health fail
    os._exit(4)


def follower_main(
    rank: int, world_size: int, port: int, leader_pid: int, config: dict[str, object]
) -> None:
    """Ranks > 0: same scheduler, same model shard, inputs from rank 0, no HTTP."""
    from genpool_worker.multirank import (
        DistCoordinator,
        close_process_group,
        init_process_group,
        watch_leader,
    )

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(name)s %(message)s")
    watch_leader(leader_pid)
    try:
        parsed = WorkerConfig.model_validate(config)
        init_process_group(
            rank, world_size, port, backend="nccl" if parsed.device == "cuda" else "gloo"
        )
        pool_size = build_scheduler(parsed).slots.pool_size
        runner, tokenizer, scheduler = build_runner(parsed, pool_size, tp_rank=rank)
    except Exception as exc:  # the pod's one termination log names the rank that failed
        report_fatal(f"tensor-parallel rank {rank}: {type(exc).__name__}: {exc}", _traceback_tail())
        raise
    GenEngine(runner, tokenizer, scheduler, coordinator=DistCoordinator(rank)).run()
    close_process_group()


__all__ = [
    "ConfigEnvError",
    "WorkerConfig",
    "build_model",
    "build_parser",
    "build_runner",
    "build_scheduler",
    "config_from_env",
    "main",
    "model_max_seq_len",
    "parse_config",
]

if __name__ == "__main__":
    sys.exit(main())
