"""The replica scaler's values: the state it keeps across rounds (``ScalerState``, which
the operator round-trips through ``status.scaling.state``) and the inputs of one
decision (``ScaleInputs``: ``status.scaling.inputs``, the Events' numbers). The law that
makes them is :mod:`genpool_core.scaler`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from genpool_core.scaler_estimates import Estimates


@dataclass(frozen=True, slots=True)
class ScalerState:
    # (time, replicas that hold the smoothed demand) over the down window
    recommendations: tuple[tuple[float, int], ...] = ()
    estimates: Estimates = field(default_factory=Estimates)

    def to_status(self) -> dict[str, object]:
        return {
            "recommendations": [[t, n] for t, n in self.recommendations],
            "estimates": self.estimates.to_status(),
        }

    @classmethod
    def from_status(cls, status: Mapping[str, object] | None) -> ScalerState:
        """Tolerant: anything unreadable restarts that part (scale-down waits)."""
        if not isinstance(status, Mapping):
            return cls()
        kept = []
        items = status.get("recommendations")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, list) and len(item) == 2 and all(_is_count(v) for v in item):
                kept.append((float(item[0]), int(item[1])))
        return cls(tuple(kept), Estimates.from_status(status.get("estimates")))


def _is_count(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True, slots=True)
class ScaleInputs:
    """A decision's inputs, as the status and Events show them."""

    arrival_rate: float  # requests/s this window
    forecast: float  # requests/s one horizon ahead
    service_s: float | None  # batch position-seconds per request
    capacity: float  # learned share of a replica's batch positions
    occupancy: float | None  # this window's share of them in use
    tail: float | None  # two windows' mean of the SLO-normalised tail
    pause_budget: int | None  # at-risk waiters pausing can still admit (pool); None: off
    backlog: int  # waiters pausing cannot admit
    forecast_replicas: int  # replicas that hold the forecast (less what pausing absorbs)
    backlog_replicas: int  # more to drain the backlog within the horizon
    tail_replicas: int  # what the tail asks (0: below tail_up)
    consolidated: int  # replicas that hold the smoothed demand at the learned capacity
    per_replica_rate: float | None  # requests/s a replica serves at the learned capacity
    is_rising: bool = False  # the forecast climbs past the level: no consolidation

    def to_status(self) -> dict[str, object]:
        """``status.scaling.inputs``: every number the decision read, JSON-safe."""
        return {
            "arrivalRate": _round(self.arrival_rate),
            "forecast": _round(self.forecast),
            "serviceSeconds": _round(self.service_s),
            "capacity": _round(self.capacity),
            "capacityPerReplica": _round(self.per_replica_rate),
            "occupancy": _round(self.occupancy),
            "tail": _round(self.tail),
            "pauseBudget": self.pause_budget,
            "backlog": self.backlog,
            "forecastReplicas": self.forecast_replicas,
            "backlogReplicas": self.backlog_replicas,
            "tailReplicas": self.tail_replicas,
            "consolidatedReplicas": self.consolidated,
            "rising": self.is_rising,
        }

    def text(self) -> str:
        """The inputs an Event quotes: ``forecast 11.3 req/s, capacity 1.62 req/s per
        replica (0.81 of the batch), tail 0.42, pause budget 12, backlog 0``."""
        rate = "-" if self.per_replica_rate is None else f"{self.per_replica_rate:.2f}"
        tail = "-" if self.tail is None else f"{self.tail:.2f}"
        budget = "off" if self.pause_budget is None else str(self.pause_budget)
        return (
            f"forecast {self.forecast:.2f} req/s, capacity {rate} req/s per replica"
            f" ({self.capacity:.2f} of the batch), tail {tail}, pause budget {budget},"
            f" backlog {self.backlog}"
        )


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)
