"""The GenPool spec as pydantic models: the CRD's defaults, bounds and CEL rules, in Python.

The apiserver checks a GenPool against the CRD before the operator sees it; these models
check it again so that unit tests, the simulator and a GenPool read from a file (or from an
apiserver with an older CRD) meet the same rules. Rule messages are word for word the CRD's
``x-kubernetes-validations`` messages. Pure: no Kubernetes client, no clock, no I/O.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.names import (
    CRD_MODES,
    DEFAULT_ADMISSION_TARGET_MAX_S,
    DEFAULT_ADMISSION_TARGET_MIN_S,
    DEFAULT_MAX_PAUSES_PER_REQUEST,
    DEFAULT_SLACK_S,
    DEFAULT_STAT_INTERVAL_S,
)

Mode = Literal["Off", "TpotBudget", "TargetOutputTps"]
RESERVED_ENV_NAMES = frozenset({"POD_IP", "POD_NAME", "POD_NAMESPACE", "HOME"})
RESERVED_ENV_PREFIX = "GENPOOL_"
# core/v1 resource.Quantity, as the CRD's pattern spells it.
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# Where a GenPool's modelVolume is mounted (read-only) in the worker container.
MODEL_MOUNT_PATH = "/models"


class GenPoolSpecError(ValueError):
    """An invalid GenPool spec; one line per problem, each naming the field (``spec.x.y``)."""


class _Section(BaseModel):
    # strict: the apiserver rejects "3" for an integer, so the model does too.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True, frozen=True
    )


class ResourceRequirements(_Section):
    limits: dict[str, int | str] = Field(default_factory=dict)
    requests: dict[str, int | str] = Field(default_factory=dict)

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        for name, quantity in value.items():
            if isinstance(quantity, str) and not QUANTITY.match(quantity):
                raise ValueError(f"{name}: {quantity!r} is not a resource quantity")
        return value


class Engine(_Section):
    max_batch_size: int = Field(default=16, ge=1, le=4096)
    max_num_active_requests: int | None = Field(default=None, ge=1, le=65536)
    max_seq_len: int = Field(default=2048, ge=16, le=1048576)
    max_queue_length: int = Field(default=1024, ge=1, le=1048576)


class AdmissionTarget(_Section):
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


class Preemption(_Section):
    mode: Mode = "Off"
    tpot_budget: float | None = Field(default=None, gt=0, le=10)
    target_output_tps: float | None = Field(default=None, gt=0, le=100000)
    slack_seconds: float = Field(default=DEFAULT_SLACK_S, ge=0, le=60)
    max_pauses_per_request: int = Field(default=DEFAULT_MAX_PAUSES_PER_REQUEST, ge=1, le=100)
    admission_target_seconds: AdmissionTarget = Field(default_factory=AdmissionTarget)

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


class KnobRange(_Section):
    min: int = Field(default=0, ge=0, le=4096)
    max: int | None = Field(default=None, ge=0, le=4096)


class Tuning(_Section):
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


class Drain(_Section):
    timeout_seconds: int = Field(default=120, ge=1, le=3600)


class Slo(_Section):
    """What the user wants: GEN TTFT p90 at most ``ttftP90Seconds`` and at least
    ``attainment`` of the requests at or above T (``preemption.targetOutputTps``)."""

    ttft_p90_seconds: float = Field(gt=0, le=3600)
    attainment: float = Field(default=0.8, gt=0, lt=1)


class Autoscaling(_Section):
    """The operator's replica scaler (``genpool_core.scaler``), run every stats round."""

    enabled: bool = False
    min_replicas: int = Field(default=1, ge=1, le=256)
    max_replicas: int | None = Field(default=None, ge=1, le=256)
    scale_up_stabilization_seconds: int = Field(default=0, ge=0, le=3600)
    scale_down_stabilization_seconds: int = Field(default=300, ge=0, le=3600)
    max_step: int = Field(default=4, ge=1, le=256)

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.enabled and self.max_replicas is None:
            raise ValueError("autoscaling.maxReplicas is required when autoscaling.enabled is true")
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        return self


class Toleration(_Section):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class EnvVar(_Section):
    name: str = Field(min_length=1, max_length=253)
    value: str | None = None
    value_from: dict[str, Any] | None = None


class PodTemplate(_Section):
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


def _is_relative_inside(path: str) -> bool:
    # The CRD's CEL rule: relative, and no ".." step out of the volume.
    return not path.startswith("/") and ".." not in path.split("/")


class PersistentVolumeClaimSource(_Section):
    claim_name: str = Field(min_length=1, max_length=253)


class HostPathSource(_Section):
    path: str = Field(min_length=1, max_length=4096)

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError("modelVolume.hostPath.path must be an absolute path")
        return path


class ModelVolume(_Section):
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    host_path: HostPathSource | None = None
    sub_path: str | None = Field(default=None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _one_source(self) -> ModelVolume:
        if (self.persistent_volume_claim is None) == (self.host_path is None):
            raise ValueError(
                "modelVolume must set exactly one of persistentVolumeClaim and hostPath"
            )
        if self.sub_path is not None and not _is_relative_inside(self.sub_path):
            raise ValueError("modelVolume.subPath must be a relative path without '..'")
        return self


class EndpointPickerRef(_Section):
    """The endpoint picker's Service, as the InferencePool's ``endpointPickerRef`` names it."""

    name: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"


class InferencePool(_Section):
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


class GenPoolSpec(_Section):
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
            not _is_relative_inside(self.model) or self.model.startswith("synthetic:")
        ):
            raise ValueError(
                "model must be a relative path inside modelVolume (no leading '/', no '..', "
                "not synthetic:) when modelVolume is set"
            )
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
        return self.preemption.mode != "Off"

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
        return self.bounds().start(self.capacity_a())

    def worker_model(self) -> str:
        """The worker's ``--model``: ``model`` itself, or its directory in the mounted volume."""
        if self.model_volume is None:
            return self.model
        return posixpath.normpath(posixpath.join(MODEL_MOUNT_PATH, self.model))

    def live_config(self) -> dict[str, float]:
        """The spec's live knobs in WorkerConfig/PUT /config names (the tuner adds H and P)."""
        target = self.preemption.admission_target_seconds
        return {
            "slack_s": self.preemption.slack_seconds,
            "admission_target_min_s": target.min,
            "admission_target_max_s": target.max,
        }

    def worker_config(self) -> dict[str, Any]:
        """The worker's ``worker.json`` (WorkerConfig fields); start knobs and live fields
        included so a new pod is right before the operator's first PUT /config."""
        engine, preemption = self.engine, self.preemption
        knobs = self.start_knobs()
        config: dict[str, Any] = {
            "model": self.worker_model(),
            "device": "cuda" if self.accelerator == "nvidia" else "cpu",
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_batch_size": engine.max_batch_size,
            "max_num_active_requests": self.capacity_a(),
            "max_seq_len": engine.max_seq_len,
            "max_queue_length": engine.max_queue_length,
            "preemption_mode": CRD_MODES[preemption.mode],
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
        # The worker refuses both parameters at once: only the mode's own one goes in.
        if preemption.mode == "TpotBudget":
            config["tpot_budget"] = preemption.tpot_budget
        elif preemption.mode == "TargetOutputTps":
            config["target_output_tps"] = preemption.target_output_tps
        return config


def describe_errors(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(["spec", *(str(part) for part in error["loc"])])
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return "\n".join(lines)
