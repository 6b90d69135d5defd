"""The GenPool spec as pydantic models: the CRD's defaults, bounds and CEL rules, in Python.

The apiserver checks a GenPool against the CRD before the operator sees it; these models
check it again so that unit tests, the simulator and a GenPool read from a file (or from an
apiserver with an older CRD) meet the same rules. Rule messages are word for word the CRD's
``x-kubernetes-validations`` messages. The sections live in
:mod:`genpool_operator.spec_sections`; this module holds the whole spec, its cross-field
rules and what the operator derives from it. Pure: no Kubernetes client, no clock, no I/O.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from genpool_core.knobs import KnobBounds, Knobs, start_paused_cap_fraction
from genpool_core.names import WORKER_PORT, PreemptionMode
from genpool_operator.kv_budget import KVBudgetError, KVBudgetInputs, kv_cache_fields
from genpool_operator.spec_sections import (
    Autoscaling,
    Drain,
    Engine,
    InferencePool,
    ModelVolume,
    PodTemplate,
    Preemption,
    Prefill,
    ResourceRequirements,
    Section,
    Slo,
    Tuning,
    is_relative_inside,
)

# Where a GenPool's modelVolume is mounted (read-only) in the worker container.
MODEL_MOUNT_PATH = "/models"
GPU_SHARE_NEEDS_GPU = "engine.gpuMemoryUtilization is not allowed when accelerator is none"
KV_EVENTS_NEED_CACHING = (
    "engine.kvEvents.enabled needs engine.enablePrefixCaching (the events are the prefix cache's)"
)
# docs/pd.md: each rank holds a head shard, and per-rank KV transfer is not built.
PREFILL_NEEDS_ONE_RANK = (
    "spec.prefill needs spec.tensorParallelSize 1 (prefill/decode moves the KV blocks of one rank)"
)
# The decode workers pull KV blocks laid out by the prefill workers' model (docs/pd.md).
PREFILL_SAME_MODEL = "spec.prefill.model must be spec.model (both tiers serve one model)"


class GenPoolSpecError(ValueError):
    """An invalid GenPool spec; one line per problem, each naming the field (``spec.x.y``)."""


class GenPoolSpec(Section):
    replicas: int = Field(default=1, ge=0, le=256)
    model: str = Field(default="smollm2-135m", min_length=1, max_length=1024)
    model_volume: ModelVolume | None = None
    image: str = Field(default="", max_length=1024)
    tensor_parallel_size: int = Field(default=1, ge=1, le=8)
    accelerator: Literal["nvidia", "none"] = "nvidia"
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    engine: Engine = Field(default_factory=Engine)
    preemption: Preemption = Field(default_factory=Preemption)
    tuning: Tuning = Field(default_factory=Tuning)
    drain: Drain = Field(default_factory=Drain)
    pod_template: PodTemplate = Field(default_factory=PodTemplate)
    inference_pool: InferencePool = Field(default_factory=InferencePool)
    slo: Slo | None = None
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    advisory: bool = False
    prefill: Prefill | None = None

    @model_validator(mode="after")
    def _autoscaling_needs_slo(self) -> GenPoolSpec:
        if self.autoscaling.enabled and self.slo is None:
            raise ValueError("slo is required when autoscaling.enabled is true")
        return self

    @model_validator(mode="after")
    def _bounds_within_headroom(self) -> GenPoolSpec:
        ceiling = self._headroom_ceiling()
        checks = [
            ("tuning.residentHeadroom.min", self.tuning.resident_headroom.min),
            ("tuning.pausedCap.min", self.tuning.paused_cap.min),
            ("tuning.pausedCap.max", self.tuning.paused_cap.max),
        ]
        for name, value in checks:
            if value is not None and value > ceiling:
                raise ValueError(
                    f"{name} must not exceed tuning.residentHeadroom.max "
                    "(default A = engine.maxNumActiveRequests, else engine.maxBatchSize)"
                )
        return self

    @model_validator(mode="after")
    def _model_inside_volume(self) -> GenPoolSpec:
        if self.model_volume is not None and (
            not is_relative_inside(self.model) or self.model.startswith("synthetic:")
        ):
            raise ValueError(
                "model must be a relative path inside modelVolume (no leading '/', no '..', "
                "not synthetic:) when modelVolume is set"
            )
        return self

    @model_validator(mode="after")
    def _kv_events_need_caching(self) -> GenPoolSpec:
        if self.engine.kv_events.enabled and not self.engine.enable_prefix_caching:
            raise ValueError(KV_EVENTS_NEED_CACHING)
        return self

    @model_validator(mode="after")
    def _gpu_share_needs_gpu(self) -> GenPoolSpec:
        if self.engine.gpu_memory_utilization is not None and self.accelerator != "nvidia":
            raise ValueError(GPU_SHARE_NEEDS_GPU)
        return self

    @model_validator(mode="after")
    def _prefill_needs_one_rank(self) -> GenPoolSpec:
        if self.prefill is not None and self.tensor_parallel_size != 1:
            raise ValueError(PREFILL_NEEDS_ONE_RANK)
        return self

    @model_validator(mode="after")
    def _prefill_same_model(self) -> GenPoolSpec:
        if self.prefill is not None and self.prefill.model not in (None, self.model):
            raise ValueError(PREFILL_SAME_MODEL)
        return self

    @classmethod
    def from_body(cls, spec: dict[str, Any] | None) -> GenPoolSpec:
        """Validate a GenPool's ``spec`` (camelCase, as stored); GenPoolSpecError if invalid."""
        try:
            return cls.model_validate(spec or {})
        except ValidationError as exc:
            raise GenPoolSpecError(describe_errors(exc)) from None

    @property
    def preemption_on(self) -> bool:
        return self.preemption.kind is not PreemptionMode.OFF

    def capacity_a(self) -> int:
        """A: the base resident capacity, ``maxNumActiveRequests`` or else B."""
        return self.engine.max_num_active_requests or self.engine.max_batch_size

    def _headroom_ceiling(self) -> int:
        headroom_max = self.tuning.resident_headroom.max
        return self.capacity_a() if headroom_max is None else headroom_max

    def bounds(self) -> KnobBounds:
        """The tuner's bounds; unset maxima are A."""
        ceiling = self._headroom_ceiling()
        headroom, cap = self.tuning.resident_headroom, self.tuning.paused_cap
        # An unset cap max is A, but never above the headroom ceiling (P <= H always).
        cap_max = min(self.capacity_a(), ceiling) if cap.max is None else cap.max
        return KnobBounds(headroom.min, ceiling, cap.min, cap_max)

    def start_knobs(self) -> Knobs:
        """The knobs a new pod starts with; (0, 0) with mode Off."""
        if not self.preemption_on:
            return Knobs(0, 0)
        fraction = start_paused_cap_fraction(self.preemption.kind)
        return self.bounds().start(self.capacity_a(), fraction)

    def worker_model(self) -> str:
        """The worker's ``--model``: ``model`` itself, or its directory in the mounted volume."""
        if self.model_volume is None:
            return self.model
        return posixpath.normpath(posixpath.join(MODEL_MOUNT_PATH, self.model))

    def kv_events_config(self) -> str | None:
        """The worker's ``--kv-events-config`` (vLLM's JSON) when KV events are on: bound on
        the pod's address, topic ``kv@<pod IP>:<HTTP port>@<model>`` (llm-d's), the pod IP
        filled in by the kubelet from ``$(POD_IP)``."""
        events = self.engine.kv_events
        if not events.enabled:
            return None
        return json.dumps({
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{events.port}",
            "topic": f"kv@$(POD_IP):{WORKER_PORT}@{self.model}",
        }, separators=(",", ":"))  # fmt: skip

    def live_config(self) -> dict[str, float]:
        """The spec's live knobs in WorkerConfig/PUT /config names (the tuner adds H and P)."""
        target = self.preemption.admission_target_seconds
        return {
            "slack_s": self.preemption.slack_seconds,
            "admission_target_min_s": target.min,
            "admission_target_max_s": target.max,
        }

    def prefill_tier(self) -> GenPoolSpec | None:
        """The prefill workers' spec (None without ``spec.prefill``): this one with the
        tier's replicas and resources (unset: the GEN tier's) and preemption Off (a
        prefill worker's requests end after their first token; nothing to pause)."""
        tier = self.prefill
        if tier is None:
            return None
        return self.model_copy(
            update={
                "replicas": tier.replicas,
                "resources": self.resources if tier.resources is None else tier.resources,
                "preemption": Preemption(),
                "prefill": None,
            }
        )

    def kv_budget_inputs(self) -> KVBudgetInputs:
        return KVBudgetInputs(
            model=self.model,
            on_gpu=self.accelerator == "nvidia",
            tensor_parallel_size=self.tensor_parallel_size,
            max_seq_len=self.engine.max_seq_len,
            block_size=self.engine.kv_block_size,
            kv_cache_memory=self.engine.kv_cache_memory_bytes,
            gpu_memory_utilization=self.engine.gpu_memory_utilization,
            memory_limit=self.resources.limits.get("memory"),
        )

    def worker_config(self) -> dict[str, Any]:
        """The worker's ``worker.json`` (WorkerConfig fields); start knobs and live fields
        included so a new pod is right before the operator's first PUT /config.
        GenPoolSpecError when the KV budget cannot be derived (``checked_spec`` refuses
        such a spec before anything is rendered)."""
        engine, preemption = self.engine, self.preemption
        knobs = self.start_knobs()
        config: dict[str, Any] = {
            "model": self.worker_model(),
            "device": "cuda" if self.accelerator == "nvidia" else "cpu",
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_batch_size": engine.max_batch_size,
            "max_num_active_requests": self.capacity_a(),
            "max_seq_len": engine.max_seq_len,
            "kv_block_size": engine.kv_block_size,
            **self.kv_budget(),
            "max_queue_length": engine.max_queue_length,
            "stamp_arrival": engine.stamp_arrival,
            "enable_prefix_caching": engine.enable_prefix_caching,
            "preemption_mode": preemption.kind.value,
            "max_pauses_per_request": preemption.max_pauses_per_request,
            # With mode Off (a template field) no slot is reserved: the KV cache stays small.
            "max_resident_headroom": (
                self.bounds().max_resident_headroom if self.preemption_on else 0
            ),
            "resident_headroom": knobs.resident_headroom,
            "paused_cap": knobs.paused_cap,
            "stat_interval_s": float(self.tuning.interval_seconds),
            **self.live_config(),
        }
        if engine.max_prefill_tokens_per_pass is not None:
            config["max_prefill_tokens_per_pass"] = engine.max_prefill_tokens_per_pass
        if engine.speculative is not None:
            config["speculative_config"] = engine.speculative.worker_config()
        # The worker refuses both parameters at once: only the mode's own one goes in.
        if preemption.kind is PreemptionMode.TPOT_BUDGET:
            config["tpot_budget"] = preemption.tpot_budget
        elif preemption.kind is PreemptionMode.TARGET_OUTPUT_TPS:
            config["target_output_tps"] = preemption.target_output_tps
        return config

    def kv_budget(self) -> dict[str, int | float]:
        """The KV budget field of ``worker.json`` (``genpool_operator.kv_budget``'s rule)."""
        try:
            return kv_cache_fields(self.kv_budget_inputs())
        except KVBudgetError as exc:
            raise GenPoolSpecError(str(exc)) from None


def describe_errors(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(["spec", *(str(part) for part in error["loc"])])
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return "\n".join(lines)
