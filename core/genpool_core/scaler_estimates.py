"""What the replica scaler learns from its windows, round by round (pure; the operator
keeps it in ``status.scaling.state``, so a restarted operator continues it).

- **Forecast**: Holt's linear smoothing of the arrival rate (a level and a trend per
  window), looked ahead by the horizon a decision waits for (start-up + one round).
- **Service time**: batch position-seconds per completed request, smoothed.
- **Capacity**: the share of its batch positions a replica can fill while its windows
  meet the SLO. Not a ceiling a user sweeps: an online quantile estimate, in the
  style of the admission target X. A loaded window (occupancy near the estimate)
  that met the SLO raises it by ``gain * miss_rate``; a window that missed at or
  below it cuts it by ``gain * (1 - miss_rate)``; so it settles where loaded windows
  miss at ``miss_rate``. A pausing pool meets the SLO at a higher occupancy (the
  bursts a planner keeps headroom for are paused through), so it learns a higher
  capacity and buys fewer replicas for the same demand: pausing's saving, learned.
  Windows while replicas start or leave teach nothing (the pool is not the one the
  estimate is about).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from genpool_core.scaler_settings import ScalerSettings
from genpool_core.scaler_signals import WindowSignals

SERVICE_GAIN = 0.3  # weight of the newest window's service time
CALM_ROUNDS = 2  # undisturbed windows before one whose tail is the pool's own
NEAR = 0.3  # a window within this share of the estimate (or forecast) says something about it
MIN_CAPACITY = 0.2  # a share of the batch positions below which nothing is learned


@dataclass(frozen=True, slots=True)
class Estimates:
    level: float | None = None  # arrival rate, requests/s, smoothed; None: no window yet
    trend: float = 0.0  # its change per window
    service_s: float | None = None  # batch position-seconds per request, smoothed
    capacity: float | None = None  # learned share of a replica's positions; None: the prior
    tail: float | None = None  # the last window's tail signal (the two-window mean)
    ready: int | None = None  # replicas serving at the last round
    calm_rounds: int = 0  # undisturbed windows in a row up to the last round

    def is_disturbed(self, signals: WindowSignals, num_ready: int, settings: ScalerSettings
                     ) -> bool:  # fmt: skip
        """A window the pool was not itself in: its size changed, a backlog formed (a
        queue drains only on the replicas it formed on: new ones take new arrivals), or
        demand surged past the forecast (lag, which the forecast term answers)."""
        surge = self.level is not None and (
            signals.arrival_rate > self.forecast(settings) * (1 + NEAR)
        )
        return self.ready != num_ready or signals.backlog > num_ready or surge

    def is_calm(self, signals: WindowSignals, num_ready: int, replicas: int,
                settings: ScalerSettings) -> bool:  # fmt: skip
        """The window's tail is about the pool as it is: it served at its desired size, and
        neither this window nor the two before were disturbed (a window's first tokens and
        completions include requests that queued or were paused in the ones before)."""
        return (
            num_ready >= replicas and self.calm_rounds >= CALM_ROUNDS
            and not self.is_disturbed(signals, num_ready, settings)
        )  # fmt: skip

    def capacity_in_force(self, settings: ScalerSettings) -> float:
        if settings.capacity_override is not None:
            return settings.capacity_override
        return settings.capacity_prior if self.capacity is None else self.capacity

    def forecast(self, settings: ScalerSettings) -> float:
        """Requests/s one horizon ahead, the trend damped (a step's trend dies out instead
        of overshooting); never below the level: a falling trend is for consolidation to
        act on, with its margin and window, not for the up side."""
        if self.level is None:
            return 0.0
        windows = math.ceil(settings.horizon_s / settings.interval_s - 1e-9)
        phi = settings.forecast_trend_damping
        ahead = sum(phi**k for k in range(1, windows + 1))
        return max(self.level, self.level + self.trend * ahead)

    def updated(
        self, signals: WindowSignals, settings: ScalerSettings, *, num_ready: int,
        replicas: int,
    ) -> Estimates:  # fmt: skip
        level, trend = self._smoothed_rate(signals.arrival_rate, settings)
        service = self.service_s
        if signals.service_s is not None:
            service = signals.service_s if service is None else (
                (1 - SERVICE_GAIN) * service + SERVICE_GAIN * signals.service_s
            )  # fmt: skip
        capacity = self.capacity
        if settings.capacity_override is None and self.is_calm(signals, num_ready, replicas,
                                                                   settings):  # fmt: skip
            capacity = learned_capacity(self.capacity_in_force(settings), signals, settings)
        calm = 0 if self.is_disturbed(signals, num_ready, settings) else self.calm_rounds + 1
        return Estimates(level, trend, service, capacity, signals.tail, num_ready, calm)

    def _smoothed_rate(self, rate: float, settings: ScalerSettings) -> tuple[float, float]:
        if self.level is None:
            return rate, 0.0
        alpha = settings.per_window(settings.forecast_level_gain)
        beta = settings.per_window(settings.forecast_trend_gain)
        trend = settings.forecast_trend_damping * self.trend
        level = alpha * rate + (1 - alpha) * (self.level + trend)
        return level, beta * (level - self.level) + (1 - beta) * trend

    def to_status(self) -> dict[str, object]:
        return {
            "level": self.level,
            "trend": self.trend,
            "serviceSeconds": self.service_s,
            "capacity": self.capacity,
            "tail": self.tail,
            "ready": self.ready,
            "calmRounds": self.calm_rounds,
        }

    @classmethod
    def from_status(cls, status: object) -> Estimates:
        """Tolerant: an unreadable value starts that estimate over."""
        if not isinstance(status, Mapping):
            return cls()
        level, service = _number(status.get("level")), _number(status.get("serviceSeconds"))
        capacity = _number(status.get("capacity"))
        if capacity is not None and not MIN_CAPACITY <= capacity <= 1:
            capacity = None
        trend = status.get("trend")
        is_trend = isinstance(trend, int | float) and not isinstance(trend, bool)
        return cls(
            level=level,
            trend=float(trend) if is_trend and math.isfinite(trend) else 0.0,  # type: ignore[arg-type]
            service_s=service if service else None,
            capacity=capacity,
            tail=_number(status.get("tail")),
            ready=_count(status.get("ready")),
            calm_rounds=_count(status.get("calmRounds")) or 0,
        )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


def learned_capacity(capacity: float, signals: WindowSignals, settings: ScalerSettings) -> float:
    """One step of the capacity quantile estimate (module doc), on a calm window: a miss
    counts at or below the estimate, a met window only near it (a quiet one proves
    nothing)."""
    occupancy, tail = signals.occupancy, signals.tail
    if occupancy is None or tail is None:
        return capacity
    gain, miss_rate = settings.capacity_gain, settings.capacity_miss_rate
    if tail > 1.0 and occupancy <= capacity:
        capacity *= 1 - gain * (1 - miss_rate)
    elif tail <= 1.0 and occupancy >= capacity * (1 - NEAR):
        capacity *= 1 + gain * miss_rate
    return min(1.0, max(MIN_CAPACITY, capacity))
