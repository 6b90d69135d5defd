"""The worker's configuration: ``WorkerConfig`` (every field a flag, its help the field's
description with unit and default, ``genpool_core.field_help``) and the scheduler it
builds; :mod:`genpool_worker.worker_args` reads it from GENPOOL_WORKER_CONFIG and the
command line. No torch here, so ``genpool-worker --help`` and config errors are fast."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from genpool_core.field_help import describe
from genpool_core.kv_blocks import KVBudget
from genpool_core.model_catalogue import known_shape
from genpool_core.names import (
    DEFAULT_ADMISSION_TARGET_MAX_S,
    DEFAULT_ADMISSION_TARGET_MIN_S,
    DEFAULT_KV_BLOCK_SIZE,
    DEFAULT_MAX_PAUSES_PER_REQUEST,
    DEFAULT_SLACK_S,
    DEFAULT_STAT_INTERVAL_S,
    WORKER_PORT,
    PreemptionMode,
)
from genpool_core.preemption import GenCapacity, GenPreemptionSettings
from genpool_core.prefill_budget import PrefillOrder
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_core.stat_fields import MIN_STAT_INTERVAL_S
from genpool_worker.api import DEFAULT_MAX_ARRIVAL_AGE_S
from genpool_worker.kv_events_config import FLAG as KV_EVENTS_FLAG
from genpool_worker.kv_events_config import KVEventsConfig, parse_kv_events_config
from genpool_worker.pd.flags import PDFlags
from genpool_worker.speculative import SpeculativeConfig, parse_speculative_config

Mode = Literal["off", "tpot_budget", "target_output_tps"]
# --max-seq-len unset: the model's context, at most this (tokens). Off CUDA the default KV
# cache is B + max headroom requests of it, so the CPU cap keeps that memory bounded.
MAX_SEQ_LEN_CAP = 2048
MAX_SEQ_LEN_CAP_CUDA = 8192
SYNTHETIC_PREFIX = "synthetic:"  # --model synthetic:<name>: no weights (synthetic.py)
SYNTHETIC_MAX_SEQ_LEN = 2048  # a synthetic model has no context of its own
# --max-prefill-tokens-per-pass unset (tokens). CPU: measured, SmolLM2 on one core
# (docs/results.md#chunked-prefill-on-cpu): 128 kept decode gaps near 1 s under 2k-token
# prompts where whole prefills stalled them 42 s. CUDA: unmeasured, vLLM's long-standing
# default token budget for a pass.
PREFILL_TOKENS_PER_PASS = 128
PREFILL_TOKENS_PER_PASS_CUDA = 2048


class MaxSeqLenError(ValueError):
    """``--max-seq-len`` is more than the model's context (a configuration error)."""


def resolve_max_seq_len(
    given: int | None, context: tuple[int, str] | None, device: str = "cpu"
) -> int:
    """``--max-seq-len`` once the model is known: ``context`` is its (tokens, the key they
    came from), None for a synthetic model. A given value past the context is refused,
    naming the flag; unset is the context capped (``MAX_SEQ_LEN_CAP``, on CUDA
    ``MAX_SEQ_LEN_CAP_CUDA``)."""
    if context is None:
        return SYNTHETIC_MAX_SEQ_LEN if given is None else given
    tokens, source = context
    if given is None:
        cap = MAX_SEQ_LEN_CAP_CUDA if device.startswith("cuda") else MAX_SEQ_LEN_CAP
        return min(tokens, cap)
    if given > tokens:
        raise MaxSeqLenError(
            f"--max-seq-len={given} is more than the model's context of {tokens} tokens"
            f" ({source}); set --max-seq-len <= {tokens}, or leave it unset for the model's own"
        )
    return given


def check_tensor_parallel_size(model: str, size: int) -> None:
    """Refuse a size that cannot shard a model of the catalogue before anything loads
    (the operator applies the same rule at reconcile; other checkpoints are checked when
    their weights load)."""
    shape = known_shape(model)
    if shape is not None and (size < 1 or not shape.can_shard(size)):
        sizes = ", ".join(map(str, shape.tensor_parallel_sizes()))
        raise ValueError(
            f"tensor_parallel_size={size} must divide {model}'s {shape.num_heads} query heads, "
            f"{shape.num_kv_heads} KV heads and MLP width {shape.ffn_size} (sizes: {sizes})"
        )


def _preemption(name: str) -> str:
    """A preemption field's one description, ``GenPreemptionSettings``'."""
    return describe(GenPreemptionSettings, name)


# The fields WorkerConfig inherits (the KV transfer's): --help lists them after the engine's.
INHERITED_FLAGS = frozenset(PDFlags.model_fields)


class WorkerConfig(PDFlags):
    """Everything the CRD's engine and preemption sections can set, checked once. A field
    that is also a ``GenCapacity`` or ``GenPreemptionSettings`` field has its description.
    The KV transfer flags are inherited whole (their module says what they do)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        default="smollm2-135m",
        description="smollm2-135m (the packaged GGUF), a .gguf file, a Hugging Face "
        "checkpoint directory, or synthetic:<name> (no weights, simulated step times)",
    )
    host: str = Field(default="127.0.0.1", description="HTTP listen address")
    port: int = Field(default=WORKER_PORT, ge=0, le=65535, description="HTTP port, 0-65535")
    device: str = Field(default="cpu", description="torch device: cpu or cuda")
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=64,
        description="ranks (processes) sharding the model, count; must divide its query and"
        " KV heads and MLP width (SmolLM2-135M: 1 or 3)",
    )
    max_batch_size: int = Field(
        default=16, ge=1, le=4096, description=describe(GenCapacity, "max_batch_size")
    )
    max_num_active_requests: int | None = Field(
        default=None, ge=1, description=describe(GenCapacity, "max_num_active_requests")
    )
    max_seq_len: int | None = Field(
        default=None,
        ge=16,
        le=1 << 20,
        description="most prompt plus output tokens of one request (a KV slot's length),"
        " tokens; at most the model's context; default: the model's context (an HF"
        " checkpoint's max_position_embeddings or shorter sliding window, a GGUF's"
        f" <arch>.context_length) capped at {MAX_SEQ_LEN_CAP_CUDA} on CUDA and"
        f" {MAX_SEQ_LEN_CAP} elsewhere (the CPU's default KV cache holds B + max headroom"
        f" requests of it); synthetic models: {SYNTHETIC_MAX_SEQ_LEN}",
    )
    kv_block_size: int = Field(
        default=DEFAULT_KV_BLOCK_SIZE,
        ge=1,
        le=1024,
        description="tokens per KV-cache block (the unit of KV memory a request holds), tokens",
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="prefix caching: a request shares the KV blocks of the prompt prefix an"
        " earlier request computed (whole blocks of tokens, found by hash), and its prefill"
        " starts after them; cached blocks nobody holds are evicted least recently used"
        " when memory is needed (vLLM's --enable-prefix-caching)",
    )
    kv_events_config: str | None = Field(
        default=None,
        description="KV events in vLLM's format for llm-d's precise prefix-cache routing:"
        " vLLM's --kv-events-config JSON object, e.g. '{\"enable_kv_cache_events\": true,"
        ' "endpoint": "tcp://*:5557", "topic": "kv@<pod ip>:<port>@<model>"}\' (also'
        " publisher zmq|null, replay_endpoint, buffer_steps, hwm, max_queue_size); a binding"
        " endpoint's * is --host's address (docs/worker.md#kv-events); unset: no events",
    )
    speculative_config: str | None = Field(
        default=None,
        description="speculative decoding: vLLM's --speculative-config JSON object, e.g."
        ' \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,'
        ' "prompt_lookup_min": 2}\' (n-gram prompt lookup) or \'{"method": "early_exit",'
        ' "num_speculative_tokens": 3, "num_draft_layers": 12}\' (the model\'s first layers'
        " draft); up to num_speculative_tokens drafts a step, verified in one forward"
        " (docs/worker.md#speculative-decoding); unset: off",
    )
    max_prefill_tokens_per_pass: int | None = Field(
        default=None,
        ge=0,
        description="chunked prefill: most prompt tokens prefilled in one pass, tokens; a"
        " longer prompt is prefilled over several passes while the batch keeps decoding"
        " (a pass costs one decode step plus at most this many prefill tokens); 0: each"
        f" prompt whole in the pass that admits it; default: {PREFILL_TOKENS_PER_PASS_CUDA}"
        f" on CUDA, {PREFILL_TOKENS_PER_PASS} elsewhere, 0 for a synthetic model (it"
        " stands in for the simulator's GEN worker, whose prompts come prefilled)",
    )
    prefill_order: PrefillOrder = Field(
        default="risk",
        description="who gets each pass's prefill budget first: risk (the prompt that can"
        " still make its admission target with the least laxity, then the fewest remaining"
        " tokens; the oldest keeps a quarter of the budget) or arrival (oldest first)",
    )
    kv_cache_memory: int | None = Field(
        default=None,
        ge=1,
        description="KV-cache budget, bytes (any device); default: on CUDA the"
        " --gpu-memory-utilization share, else room for B + max headroom requests of"
        " --max-seq-len",
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="CUDA: share of the GPU's memory this worker may use (weights, activations"
        " and KV cache; the KV cache gets what the measured weights and activation peak leave),"
        " fraction; default 0.9 on CUDA when --kv-cache-memory is not set",
    )
    max_queue_length: int = Field(
        default=1024,
        ge=1,
        description="most waiters in the admission queue; a request beyond gets 429, requests",
    )
    preemption_mode: Mode = Field(
        default="off",
        description="off, tpot_budget (needs --tpot-budget) or target_output_tps"
        " (needs --target-output-tps)",
    )
    target_output_tps: float | None = Field(
        default=None, gt=0, description=_preemption("target_output_tps")
    )
    tpot_budget: float | None = Field(default=None, gt=0, description=_preemption("tpot_budget"))
    slack_s: float = Field(default=DEFAULT_SLACK_S, ge=0, description=_preemption("slack_s"))
    max_pauses_per_request: int = Field(
        default=DEFAULT_MAX_PAUSES_PER_REQUEST,
        ge=1,
        description=_preemption("max_pauses_per_request"),
    )
    admission_target_min_s: float = Field(
        default=DEFAULT_ADMISSION_TARGET_MIN_S,
        gt=0,
        description=_preemption("admission_target_min_s"),
    )
    admission_target_max_s: float = Field(
        default=DEFAULT_ADMISSION_TARGET_MAX_S,
        gt=0,
        description=_preemption("admission_target_max_s"),
    )
    resident_headroom: int | None = Field(
        default=None, ge=0, description=_preemption("resident_headroom")
    )
    max_resident_headroom: int | None = Field(
        default=None, ge=0, description=_preemption("max_resident_headroom")
    )
    paused_cap: int | None = Field(default=None, ge=0, description=_preemption("paused_cap"))
    stat_interval_s: float = Field(
        default=float(DEFAULT_STAT_INTERVAL_S),
        ge=MIN_STAT_INTERVAL_S,
        description="period of the gen_preemption stat line on the pass clock, seconds"
        f" (at least {MIN_STAT_INTERVAL_S:g}: each window is known by its end, printed to"
        " that)",
    )
    stamp_arrival: bool = Field(
        default=True,
        description="key a request that carries no arrival stamp (genpool.arrival_time,"
        " x-genpool-arrival-time) with its receipt time; off: such requests are unkeyed"
        " unless they state their own SLO (x-llm-d-slo-* headers or slo)",
    )
    max_arrival_age_s: float = Field(
        default=DEFAULT_MAX_ARRIVAL_AGE_S,
        gt=0,
        le=86400,
        description="an arrival stamp (x-genpool-arrival-time, genpool.arrival_time) older"
        " than this is clamped to it, seconds: no stamp puts a request further ahead of the"
        " queue, makes it more at risk or adds more to its TTFT (docs/design.md"
        "#keyed-by-default); raise it for a router that queues requests longer",
    )
    synthetic_time_scale: float = Field(
        default=1.0,
        ge=0,
        description="synthetic model: factor on its simulated step times, unitless; 0: no sleep",
    )

    @property
    def mode(self) -> PreemptionMode:
        """``preemption_mode``, parsed once: compare members, not spellings."""
        return PreemptionMode(self.preemption_mode)

    @field_validator("kv_events_config", "speculative_config", mode="before")
    @classmethod
    def _json_object(cls, value: object) -> object:
        # GENPOOL_WORKER_CONFIG may hold the object itself rather than its JSON text.
        return json.dumps(value) if isinstance(value, dict) else value

    @field_validator("kv_events_config")
    @classmethod
    def _kv_events_valid(cls, value: str | None) -> str | None:
        if value is not None:
            parse_kv_events_config(value)
        return value

    @field_validator("speculative_config")
    @classmethod
    def _speculative_valid(cls, value: str | None) -> str | None:
        if value is not None:
            parse_speculative_config(value)
        return value

    def speculative(self) -> SpeculativeConfig | None:
        """``--speculative-config`` parsed (None: not given)."""
        given = self.speculative_config
        return None if given is None else parse_speculative_config(given)

    def kv_events(self) -> KVEventsConfig | None:
        """``--kv-events-config`` parsed (None: not given)."""
        given = self.kv_events_config
        return None if given is None else parse_kv_events_config(given)

    @model_validator(mode="after")
    def _mode_parameter(self) -> WorkerConfig:
        check_tensor_parallel_size(self.model, self.tensor_parallel_size)
        if self.kv_cache_memory is not None and self.gpu_memory_utilization is not None:
            raise ValueError("set --kv-cache-memory or --gpu-memory-utilization, not both")
        if self.gpu_memory_utilization is not None and not self.device.startswith("cuda"):
            raise ValueError("--gpu-memory-utilization needs --device cuda")
        if self.mode is PreemptionMode.TARGET_OUTPUT_TPS and self.target_output_tps is None:
            raise ValueError("--preemption-mode target_output_tps needs --target-output-tps")
        if self.mode is PreemptionMode.TPOT_BUDGET and self.tpot_budget is None:
            raise ValueError("--preemption-mode tpot_budget needs --tpot-budget")
        self.check_roles(self.tensor_parallel_size)
        events = self.kv_events()
        if events is not None and events.is_publishing and not self.enable_prefix_caching:
            raise ValueError(f"{KV_EVENTS_FLAG} publishes the prefix cache's blocks: it needs"
                             " --enable-prefix-caching")  # fmt: skip
        return self

    def prefill_budget(self) -> int | None:
        """The scheduler's per-pass prefill budget: None for whole prefills (``0``)."""
        given = self.max_prefill_tokens_per_pass
        if given is None:
            if self.model.startswith(SYNTHETIC_PREFIX):
                return None
            on_cuda = self.device.startswith("cuda")
            return PREFILL_TOKENS_PER_PASS_CUDA if on_cuda else PREFILL_TOKENS_PER_PASS
        return given or None

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
        if self.mode is PreemptionMode.TARGET_OUTPUT_TPS:
            settings["target_output_tps"] = self.target_output_tps
        elif self.mode is PreemptionMode.TPOT_BUDGET:
            settings["tpot_budget"] = self.tpot_budget
        return settings


def build_scheduler(config: WorkerConfig, kv_budget: KVBudget | None = None) -> GenScheduler:
    """The scheduler; ``kv_budget`` None only to check the config before the model loads
    (the worker's scheduler has the blocks its KV cache holds)."""
    capacity = GenCapacity(config.max_batch_size, config.max_num_active_requests)
    spec = config.speculative()
    return GenScheduler.from_settings(
        config.preemption_settings(),
        capacity,
        SchedulerConfig(
            max_queue_length=config.max_queue_length,
            stat_interval_s=config.stat_interval_s,
            kv_budget=kv_budget,
            max_prefill_tokens_per_pass=config.prefill_budget(),
            prefill_order=config.prefill_order,
            enable_prefix_caching=config.enable_prefix_caching,
            record_kv_events=(events := config.kv_events()) is not None and events.is_publishing,
            num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
        ),
    )
