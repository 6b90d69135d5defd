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
from collections.abc import Mapping
from dataclasses import dataclass, replace

from genpool_core.knobs import Knobs
from genpool_core.names import GENERATION_FIELD, LIVE_FIELDS


class StaleGenerationError(ValueError):
    """An update tagged with an older generation than the one in force."""


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

    def updated(self, update: Mapping[str, object]) -> LiveConfig:
        """This config with the fields of ``update`` (``PUT /config`` names) replaced.

        Raises ``StaleGenerationError`` for an older generation, ``ValueError`` for an
        unknown field, ``TypeError`` for a wrong type.
        """
        unknown = sorted(set(update).difference((*LIVE_FIELDS, GENERATION_FIELD)))
        if unknown:
            raise ValueError(f"not live fields: {', '.join(unknown)}")
        generation = _integer(update, GENERATION_FIELD, self.generation)
        if generation < self.generation:
            raise StaleGenerationError(f"stale generation {generation} < {self.generation}")
        knobs = Knobs(
            _integer(update, "resident_headroom", self.knobs.resident_headroom),
            _integer(update, "paused_cap", self.knobs.paused_cap),
        )
        return replace(
            self,
            knobs=knobs,
            slack_s=_number(update, "slack_s", self.slack_s),
            admission_target_min_s=_number(
                update, "admission_target_min_s", self.admission_target_min_s
            ),
            admission_target_max_s=_number(
                update, "admission_target_max_s", self.admission_target_max_s
            ),
            generation=generation,
        )


def _integer(update: Mapping[str, object], name: str, current: int) -> int:
    value = update.get(name)
    if value is None:
        return current
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    return value


def _number(update: Mapping[str, object], name: str, current: float) -> float:
    value = update.get(name)
    if value is None:
        return current
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)
