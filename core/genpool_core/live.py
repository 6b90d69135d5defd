"""The live configuration of a running scheduler: one value, checked whole, applied whole.

``PUT /config`` (the operator's pool controller) and the simulator's controller change
these fields without a restart (their names are :data:`genpool_core.names.LIVE_FIELDS`),
tagged with the operator's generation (:data:`genpool_core.names.GENERATION_FIELD`),
which is part of the value: the knobs and the generation they came with are applied
together, in the engine's loop, so no reader sees one without the other. A change is a
new :class:`LiveConfig`; :meth:`GenScheduler.reconfigure` checks all of it before any
of it takes effect, so a bad update leaves the old one in force.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field, field_validator

from genpool_core.knobs import Knobs
from genpool_core.names import GENERATION_FIELD


class StaleGenerationError(ValueError):
    """An update tagged with an older generation than the one in force."""


class LiveUpdate(BaseModel):
    """A change to the live config, as ``PUT /config`` carries it: any of the live fields,
    tagged with the operator's generation. The wire format, the engine's inbox item and
    the operator's push are this one type; ``LIVE_FIELDS`` are its fields."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    generation: int = Field(ge=0)
    resident_headroom: int | None = Field(default=None, ge=0)
    paused_cap: int | None = Field(default=None, ge=0)
    slack_s: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    admission_target_min_s: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    admission_target_max_s: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)

    @field_validator("slack_s", "admission_target_min_s", "admission_target_max_s", mode="before")
    @classmethod
    def _int_ok(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer too large for a float: a 422, not a 500
                raise ValueError("number too large") from None
        return value

    def values(self) -> dict[str, float | int]:
        """The live fields it sets (no generation): the operator's ``liveConfig``."""
        return {
            k: v for k, v in self.model_dump(exclude={GENERATION_FIELD}).items() if v is not None
        }

    def to_json(self) -> dict[str, float | int]:
        """``PUT /config``'s body."""
        return {GENERATION_FIELD: self.generation, **self.values()}


# Fields of PUT /config: pushed to running workers, so a change never rolls the pods.
LIVE_FIELDS = tuple(name for name in LiveUpdate.model_fields if name != GENERATION_FIELD)


@dataclass(frozen=True, slots=True)
class LiveConfig:
    knobs: Knobs
    slack_s: float
    admission_target_min_s: float
    admission_target_max_s: float
    generation: int = 0  # the operator's version of these values: never goes back

    def check(self, max_resident_headroom: int, is_preemption_on: bool) -> None:
        """Raise ``ValueError`` naming the first field that cannot be applied."""
        headroom, cap = self.knobs.resident_headroom, self.knobs.paused_cap
        if not 0 <= headroom <= max_resident_headroom:
            raise ValueError(
                f"resident_headroom={headroom} must be within [0, {max_resident_headroom}]"
            )
        if cap > 0 and not is_preemption_on:
            raise ValueError("paused_cap must be 0 while preemption is off")
        if cap < 0 or cap > headroom:
            raise ValueError(f"paused_cap={cap} must be within [0, resident_headroom={headroom}]")
        if not (math.isfinite(self.slack_s) and self.slack_s >= 0.0):
            raise ValueError(f"slack_s must be a finite value >= 0, got {self.slack_s}")
        x_min, x_max = self.admission_target_min_s, self.admission_target_max_s
        if not (math.isfinite(x_min) and math.isfinite(x_max) and 0.0 < x_min <= x_max):
            raise ValueError(f"admission target bounds need 0 < min <= max, got {x_min}, {x_max}")

    def updated(self, update: LiveUpdate) -> LiveConfig:
        """This config with the fields ``update`` sets; ``StaleGenerationError`` for an
        older generation (the same one applies again: a retried push)."""
        if update.generation < self.generation:
            raise StaleGenerationError(f"stale generation {update.generation} < {self.generation}")

        def pick(value: float | int | None, current: float | int) -> float | int:
            return current if value is None else value

        knobs = Knobs(
            int(pick(update.resident_headroom, self.knobs.resident_headroom)),
            int(pick(update.paused_cap, self.knobs.paused_cap)),
        )
        return replace(
            self,
            knobs=knobs,
            slack_s=float(pick(update.slack_s, self.slack_s)),
            admission_target_min_s=float(
                pick(update.admission_target_min_s, self.admission_target_min_s)
            ),
            admission_target_max_s=float(
                pick(update.admission_target_max_s, self.admission_target_max_s)
            ),
            generation=update.generation,
        )
