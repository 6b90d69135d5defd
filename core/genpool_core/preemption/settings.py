"""User-facing preemption settings, the capacity they apply to, and the setup check.

``GenPreemptionSettings`` holds only what a user sets (the CRD's preemption knobs);
policy constants are class attributes of the policies. ``resolve_capacity`` is where
the defaults of docs/design.md#capacity are applied and every cross-field rule is checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genpool_core.field_help import DESCRIPTION
from genpool_core.knobs import default_paused_cap
from genpool_core.names import (
    DEFAULT_ADMISSION_TARGET_MAX_S,
    DEFAULT_ADMISSION_TARGET_MIN_S,
    DEFAULT_MAX_PAUSES_PER_REQUEST,
    DEFAULT_SLACK_S,
    PreemptionMode,
)


class GenPreemptionConfigError(ValueError):
    """A preemption or capacity setting is invalid; the message names the field."""


class GenPreemptionSettings(BaseModel):
    """What the user chooses. Mode follows from which of the two parameters is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tpot_budget: float | None = Field(
        default=None,
        description="b of tpot_budget mode: the allowed relative TPOT inflation, a request's"
        " paused time over its unpaused decode time, unitless; 0.1: pauses stretch each"
        " request's TPOT by at most 10%",
    )
    target_output_tps: float | None = Field(
        default=None,
        description="T of target_output_tps mode: the output-rate floor that at least"
        " 1 - eps = 80% of keyed requests must meet, output tokens/s per request",
    )
    slack_s: float = Field(
        default=DEFAULT_SLACK_S,
        ge=0.0,
        description="a keyed waiter is at risk (a resident may be paused for it) once its"
        " slack, admission target minus its wait so far, is at most this, seconds",
    )
    max_pauses_per_request: int = Field(
        default=DEFAULT_MAX_PAUSES_PER_REQUEST,
        ge=1,
        description="tpot_budget mode: most pauses one request may take, count",
    )
    per_pass_budget: int = Field(
        default=4,
        ge=1,
        description="most pauses, and most swaps for due resumes, in one scheduling pass, count",
    )
    admission_target_min_s: float = Field(
        default=DEFAULT_ADMISSION_TARGET_MIN_S,
        gt=0.0,
        description="x_min: lower bound of the adaptive admission target X (the 0.9 quantile"
        " of keyed admission waits), seconds",
    )
    admission_target_max_s: float = Field(
        default=DEFAULT_ADMISSION_TARGET_MAX_S,
        gt=0.0,
        description="x_max: upper bound of the adaptive admission target X (the 0.9 quantile"
        " of keyed admission waits), seconds",
    )
    resident_headroom: int | None = Field(
        default=None,
        ge=0,
        description="H: resident slots beyond B (a paused request keeps its slot and KV),"
        " requests; unset: P with preemption on, 0 with it off",
    )
    max_resident_headroom: int | None = Field(
        default=None,
        ge=0,
        description="ceiling of H for live changes, fixed at start-up: the KV cache holds"
        " B + this residents, requests; unset: H",
    )
    paused_cap: int | None = Field(
        default=None,
        ge=0,
        description="P: most requests paused in place at once, at most H, requests;"
        " unset: floor(0.375 A) (0 whenever preemption is off)",
    )

    @property
    def mode(self) -> PreemptionMode:
        if self.target_output_tps is not None:
            return PreemptionMode.TARGET_OUTPUT_TPS
        if self.tpot_budget is not None:
            return PreemptionMode.TPOT_BUDGET
        return PreemptionMode.OFF


@dataclass(frozen=True, slots=True)
class GenCapacity:
    """Engine shape (docs/design.md#capacity): B, A and the parallelism constraining preemption."""

    max_batch_size: int = field(
        metadata={DESCRIPTION: "B: most requests decoded in one pass (the batch), requests"}
    )
    max_num_active_requests: int | None = field(
        default=None,
        metadata={
            DESCRIPTION: "A: the base resident capacity the default paused cap"
            " floor(0.375 A) is taken from, requests; unset: B"
        },
    )
    pipeline_parallel_size: int = field(
        default=1,
        metadata={DESCRIPTION: "pipeline-parallel stages, count; preemption needs 1"},
    )

    @property
    def base_resident_capacity(self) -> int:
        """A: defaults to B."""
        if self.max_num_active_requests is None:
            return self.max_batch_size
        return self.max_num_active_requests


@dataclass(frozen=True, slots=True)
class ResolvedCapacity:
    max_batch_size: int
    base_resident_capacity: int
    resident_headroom: int
    max_resident_headroom: int
    paused_cap: int


def parse_settings(raw: GenPreemptionSettings | dict[str, object]) -> GenPreemptionSettings:
    if isinstance(raw, GenPreemptionSettings):
        return raw
    try:
        return GenPreemptionSettings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise GenPreemptionConfigError(f"invalid gen_preemption settings: {problems}") from None


def check_settings(settings: GenPreemptionSettings, capacity: GenCapacity) -> None:
    if settings.tpot_budget is not None and settings.target_output_tps is not None:
        raise GenPreemptionConfigError(
            "set either tpot_budget or target_output_tps, not both (they are two modes)"
        )
    tps = settings.target_output_tps
    if tps is not None and not (math.isfinite(tps) and tps > 0.0):
        raise GenPreemptionConfigError(f"target_output_tps must be a positive rate, got {tps}")
    budget = settings.tpot_budget
    if budget is not None and not (math.isfinite(budget) and budget > 0.0):
        raise GenPreemptionConfigError(f"tpot_budget must be positive, got {budget}")
    if settings.admission_target_min_s > settings.admission_target_max_s:
        raise GenPreemptionConfigError(
            f"admission_target_min_s={settings.admission_target_min_s} exceeds "
            f"admission_target_max_s={settings.admission_target_max_s}"
        )
    if capacity.max_batch_size < 1:
        raise GenPreemptionConfigError(
            f"max_batch_size must be >= 1, got {capacity.max_batch_size}"
        )
    if capacity.base_resident_capacity < 1:
        raise GenPreemptionConfigError(
            f"max_num_active_requests must be >= 1, got {capacity.base_resident_capacity}"
        )
    if capacity.pipeline_parallel_size > 1 and settings.mode is not PreemptionMode.OFF:
        raise GenPreemptionConfigError(
            "gen preemption needs pipeline_parallel_size == 1: a paused request would "
            "leave bubbles in the pipeline stages"
        )


def resolve_capacity(settings: GenPreemptionSettings, capacity: GenCapacity) -> ResolvedCapacity:
    """Apply the capacity defaults (P = floor(0.375 A), H = P, ceiling = H) and check P <= H."""
    check_settings(settings, capacity)
    a = capacity.base_resident_capacity
    if settings.mode is PreemptionMode.OFF:
        # With preemption off nothing is ever paused and headroom is 0 unless the
        # operator reserves a ceiling for turning it on later.
        headroom, cap = settings.resident_headroom or 0, 0
    else:
        cap = default_paused_cap(a) if settings.paused_cap is None else settings.paused_cap
        headroom = cap if settings.resident_headroom is None else settings.resident_headroom
    ceiling = headroom if settings.max_resident_headroom is None else settings.max_resident_headroom
    if cap > headroom:
        raise GenPreemptionConfigError(
            f"paused_cap={cap} exceeds resident_headroom={headroom}: every paused request "
            "needs a resident slot beyond the batch"
        )
    if headroom > ceiling:
        raise GenPreemptionConfigError(
            f"resident_headroom={headroom} exceeds max_resident_headroom={ceiling}"
        )
    return ResolvedCapacity(
        max_batch_size=capacity.max_batch_size,
        base_resident_capacity=a,
        resident_headroom=headroom,
        max_resident_headroom=ceiling,
        paused_cap=cap,
    )
