"""``genpool-worker``: one GEN worker process (model + engine + HTTP API)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from genpool_core.names import (
    DEFAULT_ADMISSION_TARGET_MAX_S,
    DEFAULT_ADMISSION_TARGET_MIN_S,
    DEFAULT_MAX_PAUSES_PER_REQUEST,
    DEFAULT_SLACK_S,
    DEFAULT_STAT_INTERVAL_S,
    SLO_MODE,
    TPOT_MODE,
    WORKER_PORT,
)
from genpool_core.preemption import GenCapacity, GenPreemptionConfigError
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Tokenizer
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.multirank import (
    DistCoordinator,
    check_tensor_parallel_size,
    free_port,
    init_process_group,
    spawn_followers,
    watch_followers,
    watch_leader,
)

if TYPE_CHECKING:
    from genpool_worker.model_runner import DecodeModel, TorchModelRunner

log = logging.getLogger("genpool.worker")
RANK_DEATH_GRACE_S = 1.0
CONFIG_ENV = "GENPOOL_WORKER_CONFIG"
Mode = Literal["off", "tpot_budget", "target_output_tps"]


class WorkerConfig(BaseModel):
    """Everything the CRD's engine and preemption sections can set, checked once."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        default="smollm2-135m",
        description="smollm2-135m (the packaged GGUF), a .gguf file, a Hugging Face "
        "checkpoint directory, or synthetic:<name> (no weights, simulated step times)",
    )
    host: str = Field(default="127.0.0.1", description="HTTP listen address")
    port: int = Field(default=WORKER_PORT, ge=0, le=65535, description="HTTP port (0-65535)")
    device: str = Field(default="cpu", description="torch device: cpu or cuda")
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="ranks (processes) sharding the model (1 or 3)"
    )
    max_batch_size: int = Field(
        default=16, ge=1, le=4096, description="B: requests decoded per pass (requests)"
    )
    max_num_active_requests: int | None = Field(
        default=None, ge=1, description="resident cap (requests; default: B + max headroom)"
    )
    max_seq_len: int = Field(
        default=2048, ge=16, le=1 << 20, description="prompt + output per request (tokens)"
    )
    max_queue_length: int = Field(
        default=1024, ge=1, description="admission queue size before 429 (requests)"
    )
    preemption_mode: Mode = Field(
        default="off", description="off, tpot_budget or target_output_tps"
    )
    target_output_tps: float | None = Field(
        default=None, gt=0, description="T for target_output_tps (tokens/s per request)"
    )
    tpot_budget: float | None = Field(
        default=None, gt=0, description="budget for tpot_budget mode (seconds per token)"
    )
    slack_s: float = Field(
        default=DEFAULT_SLACK_S,
        ge=0,
        description="a waiter is at risk within this of X (seconds)",
    )
    max_pauses_per_request: int = Field(
        default=DEFAULT_MAX_PAUSES_PER_REQUEST,
        ge=1,
        description="pauses one request may take (count)",
    )
    admission_target_min_s: float = Field(
        default=DEFAULT_ADMISSION_TARGET_MIN_S,
        gt=0,
        description="lower bound of the adaptive target X (seconds)",
    )
    admission_target_max_s: float = Field(
        default=DEFAULT_ADMISSION_TARGET_MAX_S,
        gt=0,
        description="upper bound of the adaptive target X (seconds)",
    )
    resident_headroom: int | None = Field(
        default=None, ge=0, description="H: residents allowed beyond B (requests)"
    )
    max_resident_headroom: int | None = Field(
        default=None,
        ge=0,
        description="ceiling of H for live changes; sizes the KV pool (requests)",
    )
    paused_cap: int | None = Field(
        default=None, ge=0, description="P: requests paused in place at once (requests)"
    )
    stat_interval_s: float = Field(
        default=float(DEFAULT_STAT_INTERVAL_S),
        gt=0,
        description="period of the gen_preemption stat line (seconds)",
    )
    stamp_arrival: bool = Field(
        default=False,
        description="stamp requests without genpool.arrival_time on receipt (makes them keyed)",
    )
    synthetic_time_scale: float = Field(
        default=1.0,
        ge=0,
        description="synthetic model: factor on simulated step times (0 = no sleep)",
    )

    @model_validator(mode="after")
    def _mode_parameter(self) -> WorkerConfig:
        if self.tensor_parallel_size > 1 and self.model == "smollm2-135m":
            # Other checkpoints' head counts are checked when the model loads.
            check_tensor_parallel_size(self.tensor_parallel_size)
        if self.preemption_mode == SLO_MODE and self.target_output_tps is None:
            raise ValueError("--preemption-mode target_output_tps needs --target-output-tps")
        if self.preemption_mode == TPOT_MODE and self.tpot_budget is None:
            raise ValueError("--preemption-mode tpot_budget needs --tpot-budget")
        return self

    def preemption_settings(self) -> dict[str, object]:
        settings: dict[str, object] = {
            "slack_s": self.slack_s,
            "max_pauses_per_request": self.max_pauses_per_request,
            "admission_target_min_s": self.admission_target_min_s,
            "admission_target_max_s": self.admission_target_max_s,
            "resident_headroom": self.resident_headroom,
            "max_resident_headroom": self.max_resident_headroom,
            "paused_cap": self.paused_cap,
        }
        if self.preemption_mode == SLO_MODE:
            settings["target_output_tps"] = self.target_output_tps
        elif self.preemption_mode == TPOT_MODE:
            settings["tpot_budget"] = self.tpot_budget
        return settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genpool-worker", description=__doc__)
    for name, field in WorkerConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, action="store_true", default=None, help=field.description)
        else:
            shown = "" if field.default is None else f" [default: {field.default}]"
            parser.add_argument(flag, default=None, help=f"{field.description}{shown}")
    return parser


class ConfigEnvError(ValueError):
    """GENPOOL_WORKER_CONFIG is not a JSON object."""


def config_from_env(environ: Mapping[str, str]) -> dict[str, object]:
    """The base config from GENPOOL_WORKER_CONFIG (the operator's worker.json), or {}."""
    raw = environ.get(CONFIG_ENV, "").strip()
    if not raw:
        return {}
    try:
        loaded = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigEnvError(f"{CONFIG_ENV} is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigEnvError(f"{CONFIG_ENV} must be a JSON object, got {type(loaded).__name__}")
    return loaded


def parse_config(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> WorkerConfig:
    """GENPOOL_WORKER_CONFIG first, then the flags given on the command line over it."""
    base = config_from_env(os.environ if environ is None else environ)
    ns = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(ns).items() if v is not None}
    return WorkerConfig.model_validate({**base, **given})


def build_scheduler(config: WorkerConfig) -> GenScheduler:
    capacity = GenCapacity(config.max_batch_size, config.max_num_active_requests)
    return GenScheduler.from_settings(
        config.preemption_settings(),
        capacity,
        SchedulerConfig(
            max_queue_length=config.max_queue_length, stat_interval_s=config.stat_interval_s
        ),
    )


def torch_threads(tensor_parallel_size: int) -> int:
    """Threads per rank: ``OMP_NUM_THREADS`` when set (several pods sharing a host
    without CPU limits, as on the devcluster), else the cores split among the ranks,
    because oversubscribed torch threads collapse throughput."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (os.cpu_count() or 1) // tensor_parallel_size)


def build_model(
    config: WorkerConfig, num_slots: int, tp_rank: int = 0
) -> tuple[DecodeModel, Tokenizer]:
    if config.model.startswith("synthetic:"):
        from genpool_worker.synthetic import SyntheticModel, SyntheticTokenizer

        model = SyntheticModel(
            config.model.split(":", 1)[1] or "default",
            num_slots=num_slots,
            max_seq_len=config.max_seq_len,
            time_scale=config.synthetic_time_scale,
        )
        return model, SyntheticTokenizer()
    import torch

    from genpool_worker.model.gguf_weights import find_smollm2_gguf
    from genpool_worker.model.llama import LlamaModel
    from genpool_worker.model.tokenizer import load_tokenizer

    torch.set_num_threads(torch_threads(config.tensor_parallel_size))
    path = find_smollm2_gguf() if config.model == "smollm2-135m" else config.model
    llama = LlamaModel.load(  # a GGUF file or a Hugging Face checkpoint directory
        path,
        num_slots=num_slots,
        max_seq_len=config.max_seq_len,
        device=config.device,
        tp_rank=tp_rank,
        tp_size=config.tensor_parallel_size,
    )
    return llama, load_tokenizer(path)


def build_runner(
    config: WorkerConfig, num_slots: int, tp_rank: int = 0
) -> tuple[TorchModelRunner, Tokenizer]:
    """The model (this rank's shard) behind its runner, and the tokenizer."""
    from genpool_worker.model_runner import TorchModelRunner

    model, tokenizer = build_model(config, num_slots, tp_rank)
    return TorchModelRunner(model), tokenizer


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = parse_config(argv)
        scheduler = build_scheduler(config)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "config"
            print(f"genpool-worker: error: {where}: {error['msg']}", file=sys.stderr)
        return 2
    except (GenPreemptionConfigError, ConfigEnvError) as exc:
        print(f"genpool-worker: error: {exc}", file=sys.stderr)
        return 2
    log.info(scheduler.policy.enabled_line())
    tp = config.tensor_parallel_size
    coordinator = None
    if tp > 1:
        port = free_port()
        followers = spawn_followers(tp, port, follower_main, (config.model_dump(),))
        init_process_group(0, tp, port, backend="nccl" if config.device == "cuda" else "gloo")
        coordinator = DistCoordinator(0)
    runner, tokenizer = build_runner(config, scheduler.slots.pool_size)
    info = runner.info
    if info.is_synthetic:
        log.info("model %s is SYNTHETIC: no weights, simulated step times", info.name)
    metrics = WorkerMetrics(info.name, info.is_synthetic)
    engine = GenEngine(
        runner, tokenizer, scheduler, on_step=metrics.observe_step, coordinator=coordinator
    )
    if tp > 1:
        watch_followers(followers, lambda rank, code: _rank_died(engine, rank, code))
    from genpool_worker.server import create_app

    app = create_app(
        engine,
        tokenizer,
        metrics,
        admin_token=os.environ.get("GENPOOL_ADMIN_TOKEN") or None,
        stamp_arrival=config.stamp_arrival,
    )
    import uvicorn

    engine.start()
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level="warning")
    finally:
        engine.stop()
    return 1 if engine.error else 0


def _rank_died(engine: GenEngine, rank: int, exitcode: int) -> None:
    """A dead rank takes the worker down: readiness false at once, then exit non-zero."""
    engine.error = RuntimeError(f"rank {rank} exited with code {exitcode}")
    log.error("rank %d exited with code %d: shutting the worker down", rank, exitcode)
    time.sleep(RANK_DEATH_GRACE_S)  # let probes see /ready and /health fail
    os._exit(4)


def follower_main(
    rank: int, world_size: int, port: int, leader_pid: int, config: dict[str, object]
) -> None:
    """Ranks > 0: same scheduler, same model shard, inputs from rank 0, no HTTP."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(name)s %(message)s")
    watch_leader(leader_pid)
    parsed = WorkerConfig.model_validate(config)
    init_process_group(
        rank, world_size, port, backend="nccl" if parsed.device == "cuda" else "gloo"
    )
    scheduler = build_scheduler(parsed)
    runner, tokenizer = build_runner(parsed, scheduler.slots.pool_size, tp_rank=rank)
    GenEngine(runner, tokenizer, scheduler, coordinator=DistCoordinator(rank)).run()


if __name__ == "__main__":
    sys.exit(main())
