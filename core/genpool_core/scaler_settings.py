"""The replica scaler's settings: the SLO, the replica bounds, the law's constants.

One field description each (the simulator's flags and the CRD's docs render them);
one default each, which the CRD's ``spec.autoscaling`` takes from here (the simulator
and the operator run the same numbers). The rules that read them are
:mod:`genpool_core.scaler`; what the learned quantities mean is docs/design.md#replica-scaler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genpool_core.field_help import DESCRIPTION

# The defaults a GenPool's spec.autoscaling also takes (operator/.../spec_sections.py).
DEFAULT_MAX_STEP = 8
DEFAULT_UP_WINDOW_S = 0.0
DEFAULT_DOWN_WINDOW_S = 300.0
DEFAULT_STARTUP_S = 60.0
GAIN_REFERENCE_S = 30.0  # the forecast's gains are stated per this much of windows


@dataclass(frozen=True, slots=True)
class ScalerSettings:
    """The SLO, the replica bounds and the law's constants; a round is one stats
    interval (its window: the stat lines since the last round)."""

    ttft_p90_s: float = field(
        metadata={
            DESCRIPTION: "SLO: GEN TTFT p90 target (arrival at the GEN worker -> first"
            " token), seconds"
        }
    )
    min_replicas: int = field(metadata={DESCRIPTION: "fewest replicas the scaler keeps"})
    max_replicas: int = field(metadata={DESCRIPTION: "most replicas the scaler adds up to"})
    max_batch: int = field(metadata={DESCRIPTION: "B: batch positions per replica, requests"})
    attainment: float | None = field(
        default=0.8,
        metadata={
            DESCRIPTION: "SLO: least share of the window's completed requests at or above T"
            " (1 - eps), in (0, 1); None: the SLO is GEN TTFT alone"
        },
    )
    is_pausing: bool = field(
        default=False,
        metadata={
            DESCRIPTION: "the workers pause in place: waiters their pause budget can admit"
            " are not backlog"
        },
    )
    max_step: int = field(
        default=DEFAULT_MAX_STEP,
        metadata={DESCRIPTION: "most replicas one round adds or removes"},
    )
    up_window_s: float = field(
        default=DEFAULT_UP_WINDOW_S,
        metadata={
            DESCRIPTION: "up only as far as every recommendation over this window asked"
            " (stabilisation, whole intervals), seconds; 0: this round's"
        },
    )
    down_window_s: float = field(
        default=DEFAULT_DOWN_WINDOW_S,
        metadata={
            DESCRIPTION: "consolidate only as far as every round's demand over this window"
            " allows (stabilisation, whole intervals), seconds"
        },
    )
    interval_s: float = field(
        default=30.0,
        metadata={
            DESCRIPTION: "seconds between scaler rounds: the windows are whole intervals,"
            " covered within half of one"
        },
    )
    startup_s: float = field(
        default=DEFAULT_STARTUP_S,
        metadata={
            DESCRIPTION: "seconds from adding a replica to its serving: with one interval,"
            " the horizon the forecast looks ahead and a backlog is drained within"
        },
    )
    drain_s: float = field(
        default=90.0,
        metadata={
            DESCRIPTION: "a backlog (waiters pausing cannot admit, and what the pool falls"
            " behind by until new replicas serve) is drained within this long once they"
            " serve, seconds"
        },
    )
    capacity_override: float | None = field(
        default=None,
        metadata={
            DESCRIPTION: "expert override: the share of a replica's batch positions it is"
            " sized to fill, fixed instead of learned, in (0, 1]; None: learned"
        },
    )
    capacity_prior: float = field(
        default=0.8,
        metadata={
            DESCRIPTION: "the learned capacity's start: the share of its batch positions a"
            " replica is assumed to fill while meeting the SLO, before its windows say"
        },
    )
    capacity_miss_rate: float = field(
        default=0.03,
        metadata={
            DESCRIPTION: "the learned capacity is the occupancy at which this share of loaded"
            " windows misses the SLO (a quantile the estimate tracks), unitless"
        },
    )
    capacity_gain: float = field(
        default=0.2,
        metadata={
            DESCRIPTION: "the capacity estimate's step: a miss cuts it by gain x (1 - miss"
            " rate), a met loaded window raises it by gain x miss rate, relative"
        },
    )
    tail_up: float = field(
        default=0.8,
        metadata={
            DESCRIPTION: "the tail signal (GEN TTFT p90 over its target, below-T share over"
            " its budget; the larger, two windows' mean) above which the pool scales up in"
            " proportion, unitless"
        },
    )
    tail_down: float = field(
        default=0.5,
        metadata={DESCRIPTION: "the tail signal below which the pool may consolidate, unitless"},
    )
    forecast_level_gain: float = field(
        default=0.5,
        metadata={
            DESCRIPTION: "the forecast's smoothing of the arrival rate (Holt's alpha) per"
            " 30 s of windows, in (0, 1]; a shorter interval takes proportionally smaller"
            " steps, so the forecast follows the load alike at any interval"
        },
    )
    forecast_trend_gain: float = field(
        default=0.3,
        metadata={
            DESCRIPTION: "the forecast's smoothing of the arrival rate's trend (Holt's beta)"
            " per 30 s of windows, in [0, 1]"
        },
    )
    forecast_trend_damping: float = field(
        default=1.0,
        metadata={
            DESCRIPTION: "the forecast's trend damping (damped Holt's phi): a trend's weight"
            " k windows ahead is phi**k, so a step's trend dies out instead of overshooting,"
            " in [0, 1]"
        },
    )
    min_samples: int = field(
        default=20,
        metadata={
            DESCRIPTION: "fewer first tokens (TTFT), completions (attainment, service time)"
            " than this in the window: that part is noise and no rule uses it, count"
        },
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttft_p90_s) and self.ttft_p90_s > 0):
            raise ValueError(f"TTFT p90 target must be > 0 s, got {self.ttft_p90_s}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 1 <= min replicas <= max replicas, got {self.min_replicas}, "
                f"{self.max_replicas}"
            )
        if self.attainment is not None and not 0 < self.attainment < 1:
            raise ValueError(f"attainment must be in (0, 1), got {self.attainment}")
        if self.max_batch < 1 or self.max_step < 1:
            raise ValueError("need max batch >= 1 and max step >= 1")
        self._check_shares()
        if not (self.down_window_s >= 0 and self.up_window_s >= 0 and self.startup_s >= 0):
            raise ValueError("need up and down windows and the start-up >= 0 s")
        if not (math.isfinite(self.drain_s) and self.drain_s > 0):
            raise ValueError(f"drain time must be > 0 s, got {self.drain_s}")
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"interval must be > 0 s, got {self.interval_s}")
        if not 0 < self.tail_down < self.tail_up:
            raise ValueError("need 0 < tail_down < tail_up")

    def _check_shares(self) -> None:
        shares = {
            "capacity_prior": self.capacity_prior,
            "capacity_miss_rate": self.capacity_miss_rate,
            "capacity_gain": self.capacity_gain,
            "forecast_level_gain": self.forecast_level_gain,
        }
        if self.capacity_override is not None:
            shares["capacity_override"] = self.capacity_override
        bad = [name for name, value in shares.items() if not 0 < value <= 1]
        unit = (self.forecast_trend_gain, self.forecast_trend_damping)
        if bad or not all(0 <= v <= 1 for v in unit):
            raise ValueError(f"need shares in (0, 1]: {', '.join(bad) or 'trend, margin'}")

    def per_window(self, gain_per_30_s: float) -> float:
        """A smoothing gain stated per 30 s, for one interval: ``1 - (1 - g)^(I / 30)``."""
        keep: float = (1.0 - gain_per_30_s) ** (self.interval_s / GAIN_REFERENCE_S)
        return 1.0 - keep

    @property
    def horizon_s(self) -> float:
        """What a decision made now waits for: the start-up, then a round to see it."""
        return self.startup_s + self.interval_s

    def whole_intervals(self, window_s: float) -> float:
        """A window rounded up to whole intervals."""
        return math.ceil(window_s / self.interval_s - 1e-9) * self.interval_s

    def is_covered(self, oldest: float, now: float, window_s: float) -> bool:
        """Whether recommendations since ``oldest`` span the window, within half an interval."""
        return now - oldest >= self.whole_intervals(window_s) - self.interval_s / 2
