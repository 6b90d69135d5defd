"""The two live capacity knobs, their bounds, and the default paused cap: defined once.

A GEN worker reserves ``resident_headroom`` (H) resident slots beyond its batch size
B, and at most ``paused_cap`` (P) of them hold paused requests; P <= H always. The
operator's tuner moves both within :class:`KnobBounds` (the GenPool's
``tuning.residentHeadroom`` / ``tuning.pausedCap``), the worker applies them, the
simulator sweeps them. In code the names are ``resident_headroom`` / ``paused_cap``;
the camelCase spelling exists only at the CRD/JSON edge (:meth:`Knobs.to_json`,
:meth:`Knobs.from_json`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from genpool_core.field_help import DESCRIPTION
from genpool_core.names import PreemptionMode

# P defaults to floor(0.375 A) and H to P, where A is the base resident capacity.
DEFAULT_PAUSED_CAP_FRACTION = 0.375
# In the SLO mode P (and H) start at A: every pause there is guarded by the victim's
# laxity, so a cap no at-risk waiter needs goes unused, while a burst needs it at once,
# rounds before the tuner could raise it (docs/design.md#slo-mode-knobs-start-at-a).
SLO_PAUSED_CAP_FRACTION = 1.0
# The knobs' field names at the CRD/JSON edge (GenPool status.tuning), and nowhere else.
JSON_NAMES = {"resident_headroom": "residentHeadroom", "paused_cap": "pausedCap"}


def default_paused_cap(
    base_resident_capacity: int, fraction: float = DEFAULT_PAUSED_CAP_FRACTION
) -> int:
    """P when nobody set it: ``floor(fraction * A)``."""
    if base_resident_capacity < 0 or not (math.isfinite(fraction) and fraction >= 0.0):
        raise ValueError(
            f"need A >= 0 and a fraction >= 0, got A={base_resident_capacity}, fraction={fraction}"
        )
    return math.floor(fraction * base_resident_capacity)


def start_paused_cap_fraction(mode: PreemptionMode) -> float:
    """P's start as a fraction of A in ``mode``: A in the SLO mode, else the default."""
    if mode is PreemptionMode.TARGET_OUTPUT_TPS:
        return SLO_PAUSED_CAP_FRACTION
    return DEFAULT_PAUSED_CAP_FRACTION


@dataclass(frozen=True, slots=True)
class Knobs:
    """The per-worker knobs in force: H resident slots beyond B, at most P of them paused."""

    resident_headroom: int
    paused_cap: int

    def to_json(self) -> dict[str, int]:
        """The CRD/JSON spelling (``residentHeadroom``, ``pausedCap``)."""
        return {
            JSON_NAMES["resident_headroom"]: self.resident_headroom,
            JSON_NAMES["paused_cap"]: self.paused_cap,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, object], fallback: Knobs) -> Knobs:
        """Read the CRD/JSON spelling; a missing or non-numeric field keeps ``fallback``'s."""
        return cls(
            _count(body.get(JSON_NAMES["resident_headroom"]), fallback.resident_headroom),
            _count(body.get(JSON_NAMES["paused_cap"]), fallback.paused_cap),
        )


def _count(value: object, fallback: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return fallback
    return int(value)


@dataclass(frozen=True, slots=True)
class KnobBounds:
    """The range the tuner may move the knobs in (unset maxima default to A upstream)."""

    min_resident_headroom: int = field(
        metadata={
            DESCRIPTION: "lowest H (resident slots beyond B) the tuner may set, requests per worker"
        }
    )
    max_resident_headroom: int = field(
        metadata={
            DESCRIPTION: "highest H (resident slots beyond B) the tuner may set, requests per"
            " worker; at least the highest P"
        }
    )
    min_paused_cap: int = field(
        metadata={
            DESCRIPTION: "lowest P (most requests paused at once) the tuner may set, requests"
            " per worker"
        }
    )
    max_paused_cap: int = field(
        metadata={
            DESCRIPTION: "highest P (most requests paused at once) the tuner may set, requests"
            " per worker; at most the highest H"
        }
    )

    def __post_init__(self) -> None:
        if not 0 <= self.min_resident_headroom <= self.max_resident_headroom:
            raise ValueError(f"need 0 <= resident_headroom min <= max, got {self}")
        if not 0 <= self.min_paused_cap <= self.max_paused_cap:
            raise ValueError(f"need 0 <= paused_cap min <= max, got {self}")
        if self.max_paused_cap > self.max_resident_headroom:
            raise ValueError(
                f"paused_cap max {self.max_paused_cap} exceeds "
                f"resident_headroom max {self.max_resident_headroom}"
            )

    def start(
        self, base_resident_capacity: int, fraction: float = DEFAULT_PAUSED_CAP_FRACTION
    ) -> Knobs:
        """The knobs a pool starts with: P = floor(fraction A) clamped into the bounds,
        H = that P clamped (H defaults to P)."""
        cap = default_paused_cap(base_resident_capacity, fraction)
        cap = self.clamp(Knobs(0, cap)).paused_cap
        return self.clamp(Knobs(cap, cap))

    def clamp(self, knobs: Knobs) -> Knobs:
        """Into the bounds, with P <= H (possible because P's max <= H's max)."""
        cap = min(max(knobs.paused_cap, self.min_paused_cap), self.max_paused_cap)
        headroom = max(knobs.resident_headroom, self.min_resident_headroom, cap)
        return Knobs(min(headroom, self.max_resident_headroom), cap)
