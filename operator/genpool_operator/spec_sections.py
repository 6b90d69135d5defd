"""The GenPool spec's sections (engine, preemption, tuning, SLO, autoscaling, pod
template, model volume, InferencePool, prefill tier) as pydantic models;
:mod:`genpool_operator.spec` assembles them into ``GenPoolSpec``. Rule messages are
word for word the CRD's ``x-kubernetes-validations`` messages. Pure: no Kubernetes
client, no clock, no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from genpool_core.names import (
    DEFAULT_ADMISSION_TARGET_MAX_S,
    DEFAULT_ADMISSION_TARGET_MIN_S,
    DEFAULT_KV_BLOCK_SIZE,
    DEFAULT_KV_EVENTS_PORT,
    DEFAULT_MAX_PAUSES_PER_REQUEST,
    DEFAULT_SLACK_S,
    DEFAULT_STAT_INTERVAL_S,
    MAX_PROMPT_LOOKUP,
    MAX_SPECULATIVE_TOKENS,
    WORKER_PORT,
    PreemptionMode,
)
from genpool_core.scaler_settings import (
    DEFAULT_DOWN_WINDOW_S,
    DEFAULT_MAX_STEP,
    DEFAULT_STARTUP_S,
    DEFAULT_UP_WINDOW_S,
)
from genpool_operator.quantity import POSITIVE_QUANTITY, is_quantity, quantity_value

Mode = Literal["Off", "TpotBudget", "TargetOutputTps"]
RESERVED_ENV_NAMES = frozenset({"POD_IP", "POD_NAME", "POD_NAMESPACE", "HOME"})
RESERVED_ENV_PREFIX = "GENPOOL_"
KV_CACHE_MEMORY_POSITIVE = "engine.kvCacheMemory must be at least 1 byte"
LOOKUP_ORDER = (
    "engine.speculative.promptLookupMin must not exceed engine.speculative.promptLookupMax"
)
DRAFT_LAYERS_NEEDED = "engine.speculative.numDraftLayers is required by method early_exit"
DRAFT_LAYERS_EARLY_EXIT_ONLY = (
    "engine.speculative.numDraftLayers is an option of method early_exit only"
)
LOOKUP_NGRAM_ONLY = (
    "engine.speculative.promptLookupMin and promptLookupMax are options of method ngram only"
)
ONE_KV_BUDGET = "engine.gpuMemoryUtilization is not allowed when engine.kvCacheMemory is set"


class Section(BaseModel):
    # strict: the apiserver rejects "3" for an integer, so the model does too.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True, frozen=True
    )


class ResourceRequirements(Section):
    limits: dict[str, int | str] = Field(default_factory=dict)
    requests: dict[str, int | str] = Field(default_factory=dict)

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        for name, quantity in value.items():
            if isinstance(quantity, str) and not is_quantity(quantity):
                raise ValueError(f"{name}: {quantity!r} is not a resource quantity")
        return value


class KVEvents(Section):
    """The worker publishes its prefix cache's KV events (vLLM's format, ZMQ PUB on
    ``port``), which llm-d's precise prefix-cache scorer subscribes to per pod."""

    enabled: bool = False
    port: int = Field(default=DEFAULT_KV_EVENTS_PORT, ge=1, le=65535)

    @field_validator("port")
    @classmethod
    def _not_the_http_port(cls, value: int) -> int:
        if value == WORKER_PORT:
            raise ValueError(f"must not be the worker's HTTP port {WORKER_PORT}")
        return value


class Speculative(Section):
    """Speculative decoding: the worker's ``--speculative-config`` (vLLM's field names;
    the worker checks the n-gram sizes' defaults, and the draft layers against the model)."""

    method: Literal["ngram", "early_exit"] = "ngram"
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS)
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=MAX_PROMPT_LOOKUP)
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=MAX_PROMPT_LOOKUP)
    num_draft_layers: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _method_options(self) -> Speculative:
        """The CRD's rules, in its order (tests/invalid_genpools.py checks both alike)."""
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        early_exit = self.method == "early_exit"
        if low is not None and high is not None and low > high:
            raise ValueError(LOOKUP_ORDER)
        if early_exit and self.num_draft_layers is None:
            raise ValueError(DRAFT_LAYERS_NEEDED)
        if not early_exit and self.num_draft_layers is not None:
            raise ValueError(DRAFT_LAYERS_EARLY_EXIT_ONLY)
        if early_exit and (low is not None or high is not None):
            raise ValueError(LOOKUP_NGRAM_ONLY)
        return self

    def worker_config(self) -> dict[str, Any]:
        """The worker's ``speculative_config`` object (vLLM's snake_case names)."""
        return self.model_dump(exclude_none=True)


class Engine(Section):
    max_batch_size: int = Field(default=16, ge=1, le=4096)
    max_num_active_requests: int | None = Field(default=None, ge=1, le=65536)
    max_seq_len: int = Field(default=2048, ge=16, le=1048576)
    max_queue_length: int = Field(default=1024, ge=1, le=1048576)
    # Key unstamped requests on receipt at the worker (docs/design.md#keyed-by-default).
    stamp_arrival: bool = True
    # The KV cache: its block size, and its budget (at most one; neither: derived,
    # genpool_operator.kv_budget).
    kv_block_size: int = Field(default=DEFAULT_KV_BLOCK_SIZE, ge=1, le=1024)
    kv_cache_memory: int | str | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    # Chunked prefill (docs/design.md#chunked-prefill); 0: each prompt whole; None: the
    # worker's default for its device.
    max_prefill_tokens_per_pass: int | None = Field(default=None, ge=0, le=1048576)
    # Prefix caching (docs/design.md#prefix-caching): share cached prompt prefixes.
    enable_prefix_caching: bool = True
    kv_events: KVEvents = Field(default_factory=KVEvents)
    # Speculative decoding (docs/worker.md#speculative-decoding); None: off.
    speculative: Speculative | None = None

    @field_validator("kv_cache_memory")
    @classmethod
    def _positive_bytes(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, str) and not POSITIVE_QUANTITY.fullmatch(value):
            raise ValueError(
                f"{value[:64]!r} is not a positive quantity of bytes "
                "(e.g. 8Gi, 512Mi or 8589934592)"
            )
        if isinstance(value, int) and value < 1:
            raise ValueError(KV_CACHE_MEMORY_POSITIVE)
        return value

    @model_validator(mode="after")
    def _one_budget(self) -> Engine:
        if self.kv_cache_memory is not None and self.gpu_memory_utilization is not None:
            raise ValueError(ONE_KV_BUDGET)
        return self

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        """``kvCacheMemory`` in bytes (a quantity rounds up to a whole byte), or None."""
        return None if self.kv_cache_memory is None else quantity_value(self.kv_cache_memory)


class AdmissionTarget(Section):
    min: float = Field(default=DEFAULT_ADMISSION_TARGET_MIN_S, gt=0)
    max: float = Field(default=DEFAULT_ADMISSION_TARGET_MAX_S, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> AdmissionTarget:
        if self.min > self.max:
            raise ValueError(
                "preemption.admissionTargetSeconds.min must not exceed "
                "preemption.admissionTargetSeconds.max"
            )
        return self


class Preemption(Section):
    mode: Mode = "Off"
    tpot_budget: float | None = Field(default=None, gt=0, le=10)
    target_output_tps: float | None = Field(default=None, gt=0, le=100000)
    slack_seconds: float = Field(default=DEFAULT_SLACK_S, ge=0, le=60)
    max_pauses_per_request: int = Field(default=DEFAULT_MAX_PAUSES_PER_REQUEST, ge=1, le=100)
    admission_target_seconds: AdmissionTarget = Field(default_factory=AdmissionTarget)

    @property
    def kind(self) -> PreemptionMode:
        """The mode, parsed once: compare members, not spellings."""
        return PreemptionMode.from_crd(self.mode)

    @model_validator(mode="after")
    def _mode_parameter(self) -> Preemption:
        needs = {"TpotBudget": "tpotBudget", "TargetOutputTps": "targetOutputTps"}
        given = {"tpotBudget": self.tpot_budget, "targetOutputTps": self.target_output_tps}
        for mode, parameter in needs.items():
            if self.mode == mode and given[parameter] is None:
                raise ValueError(
                    f"preemption.{parameter} is required when preemption.mode is {mode}"
                )
            other = next(p for p in given if p != parameter)
            if self.mode == mode and given[other] is not None:
                raise ValueError(
                    f"preemption.{other} is not allowed when preemption.mode is {mode}"
                )
        return self


class KnobRange(Section):
    min: int = Field(default=0, ge=0, le=4096)
    max: int | None = Field(default=None, ge=0, le=4096)


class Tuning(Section):
    enabled: bool = True
    interval_seconds: int = Field(default=DEFAULT_STAT_INTERVAL_S, ge=2, le=3600)
    stats_source: Literal["Http", "Log"] = "Http"
    resident_headroom: KnobRange = Field(default_factory=KnobRange)
    paused_cap: KnobRange = Field(default_factory=KnobRange)
    cooldown_intervals: int = Field(default=2, ge=0, le=100)

    @model_validator(mode="after")
    def _cap_ordered(self) -> Tuning:
        cap = self.paused_cap
        if cap.max is not None and cap.min > cap.max:
            raise ValueError("tuning.pausedCap.min must not exceed tuning.pausedCap.max")
        return self


class Drain(Section):
    timeout_seconds: int = Field(default=120, ge=1, le=3600)


class Slo(Section):
    """What the user wants: GEN TTFT p90 at most ``ttftP90Seconds`` and at least
    ``attainment`` of the requests at or above T (``preemption.targetOutputTps``)."""

    ttft_p90_seconds: float = Field(gt=0, le=3600)
    attainment: float = Field(default=0.8, gt=0, lt=1)


class Autoscaling(Section):
    """The operator's replica scaler (``genpool_core.scaler``), run every stats round.
    Its defaults are the scaler's own (``genpool_core.scaler_settings``), so the
    simulator and a GenPool run the same law."""

    enabled: bool = False
    min_replicas: int = Field(default=1, ge=1, le=256)
    max_replicas: int | None = Field(default=None, ge=1, le=256)
    scale_up_stabilization_seconds: int = Field(default=int(DEFAULT_UP_WINDOW_S), ge=0, le=3600)
    scale_down_stabilization_seconds: int = Field(default=int(DEFAULT_DOWN_WINDOW_S), ge=0, le=3600)
    max_step: int = Field(default=DEFAULT_MAX_STEP, ge=1, le=256)
    startup_seconds: int = Field(default=int(DEFAULT_STARTUP_S), ge=0, le=3600)
    # Expert override: the capacity fixed instead of learned (ScalerSettings.capacity_override).
    target_utilization: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.enabled and self.max_replicas is None:
            raise ValueError("autoscaling.maxReplicas is required when autoscaling.enabled is true")
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        return self


class Prefill(Section):
    """The prefill tier (docs/pd.md): workers that run the prompts and hand their KV blocks
    to the GEN (decode) workers. Same model and engine as the GEN tier (``spec.model``,
    ``spec.engine``): only the count and the container's resources are its own."""

    replicas: int = Field(default=1, ge=0, le=256)
    # None: the GEN tier's resources (spec.resources).
    resources: ResourceRequirements | None = None
    # Optional, and then spec.model (GenPoolSpec checks): a manifest that names the model
    # of each tier, as llm-d's do, states the tie instead of the apiserver pruning it.
    model: str | None = Field(default=None, min_length=1, max_length=1024)


class Toleration(Section):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class EnvVar(Section):
    name: str = Field(min_length=1, max_length=253)
    value: str | None = None
    value_from: dict[str, Any] | None = None


class PodTemplate(Section):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = Field(default=None, max_length=253)
    env: list[EnvVar] = Field(default_factory=list, max_length=64)

    @field_validator("env")
    @classmethod
    def _not_ours(cls, env: list[EnvVar]) -> list[EnvVar]:
        if any(is_reserved_env(var.name) for var in env):
            raise ValueError(
                "podTemplate.env must not set POD_IP, POD_NAME, POD_NAMESPACE, HOME or "
                "GENPOOL_* (the operator sets them)"
            )
        return env


def is_relative_inside(path: str) -> bool:
    # The CRD's CEL rule: relative, and no ".." step out of the volume.
    return not path.startswith("/") and ".." not in path.split("/")


class PersistentVolumeClaimSource(Section):
    claim_name: str = Field(min_length=1, max_length=253)


class HostPathSource(Section):
    path: str = Field(min_length=1, max_length=4096)

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError("modelVolume.hostPath.path must be an absolute path")
        return path


class ModelVolume(Section):
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    host_path: HostPathSource | None = None
    sub_path: str | None = Field(default=None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _one_source(self) -> ModelVolume:
        if (self.persistent_volume_claim is None) == (self.host_path is None):
            raise ValueError(
                "modelVolume must set exactly one of persistentVolumeClaim and hostPath"
            )
        if self.sub_path is not None and not is_relative_inside(self.sub_path):
            raise ValueError("modelVolume.subPath must be a relative path without '..'")
        return self


class EndpointPickerRef(Section):
    """The endpoint picker's Service, as the InferencePool's ``endpointPickerRef`` names it."""

    name: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"


class InferencePool(Section):
    """Routing by the Gateway API Inference Extension: an InferencePool of the workers."""

    enabled: bool = False
    endpoint_picker_ref: EndpointPickerRef | None = None

    @model_validator(mode="after")
    def _picker_when_enabled(self) -> InferencePool:
        if self.enabled and self.endpoint_picker_ref is None:
            raise ValueError(
                "inferencePool.endpointPickerRef is required when inferencePool.enabled is true"
            )
        return self


def is_reserved_env(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIX)
