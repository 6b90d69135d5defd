"""The replica scaler's settings: the SLO, the replica bounds, its thresholds and windows.

One field description each (the simulator's flags render them); the rules that read
them are :mod:`genpool_core.scaler`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genpool_core.field_help import DESCRIPTION


@dataclass(frozen=True, slots=True)
class ScalerSettings:
    """The SLO, the replica bounds and the scaler's thresholds and windows; a round is
    one stats interval (its window: the stat lines since the last round)."""

    ttft_p90_s: float = field(
        metadata={
            DESCRIPTION: "SLO: GEN TTFT p90 target (arrival at the GEN worker -> first"
            " token), seconds"
        }
    )
    min_replicas: int = field(metadata={DESCRIPTION: "fewest replicas the scaler keeps"})
    max_replicas: int = field(metadata={DESCRIPTION: "most replicas the scaler adds up to"})
    max_batch: int = field(
        metadata={
            DESCRIPTION: "A: batch positions per replica, for the utilisation estimate, requests"
        }
    )
    attainment: float | None = field(
        default=0.8,
        metadata={
            DESCRIPTION: "SLO: least share of the window's completed requests at or above T"
            " (1 - eps), in (0, 1); None: scale on GEN TTFT alone (the replica-only planner)"
        },
    )
    cap_max: int | None = field(
        default=None,
        metadata={
            DESCRIPTION: "the tuner's highest P, requests per worker: while the cap is below"
            " it and attainment budget is left, a TTFT miss waits for the knobs; None: no"
            " knob lever"
        },
    )
    max_step: int = field(
        default=8, metadata={DESCRIPTION: "most replicas one round adds or removes"}
    )
    up_fraction: float = field(
        default=0.25,
        metadata={
            DESCRIPTION: "an up on a TTFT or attainment miss adds this fraction of the"
            " replicas (at least 1), unitless"
        },
    )
    down_window_s: float = field(
        default=300.0,
        metadata={
            DESCRIPTION: "down only as far as every recommendation over this window allows"
            " (stabilisation, whole intervals), seconds"
        },
    )
    up_window_s: float = field(
        default=0.0,
        metadata={
            DESCRIPTION: "up only as far as every recommendation over this window asked"
            " (stabilisation, whole intervals), seconds; 0: this round's"
        },
    )
    interval_s: float = field(
        default=30.0,
        metadata={
            DESCRIPTION: "seconds between scaler rounds: the windows are whole intervals,"
            " covered within half of one"
        },
    )
    max_utilisation: float = field(
        default=0.85,
        metadata={
            DESCRIPTION: "utilisation ceiling without the knob lever: the share of the"
            " replicas' batch positions the load (batch, paused, waiting) may fill; above"
            " it: up, down to the replicas that hold the load at it, unitless"
        },
    )
    max_utilisation_with_pausing: float = field(
        default=0.95,
        metadata={
            DESCRIPTION: "utilisation ceiling with the knob lever (attainment and cap_max"
            " set): higher, since pausing absorbs the bursts a planner keeps headroom for,"
            " unitless"
        },
    )
    down_ttft_fraction: float = field(
        default=0.6,
        metadata={
            DESCRIPTION: "down only while GEN TTFT p90 is below this share of the target, unitless"
        },
    )
    severe_factor: float = field(
        default=2.0,
        metadata={
            DESCRIPTION: "a GEN TTFT p90 above this multiple of the target scales up even"
            " when the knobs could fix it, unitless"
        },
    )
    outrun_margin: float = field(
        default=0.1,
        metadata={
            DESCRIPTION: "the pool falls behind when the window's arrivals exceed its"
            " completions by more than this share, with a queue, unitless"
        },
    )
    min_waiters_per_replica: float = field(
        default=1.0,
        metadata={
            DESCRIPTION: "the queue behind the pool falling behind, requests waiting per"
            " reporting replica"
        },
    )
    min_samples: int = field(
        default=20,
        metadata={
            DESCRIPTION: "fewer first tokens (TTFT) or completions (attainment) than this in"
            " the window: that part is noise and no rule uses it, count"
        },
    )
    min_victims: int = field(
        default=4,
        metadata={
            DESCRIPTION: "fewer victims (requests picked to pause) than this in the window:"
            " an attainment miss comes from queueing, count"
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
        ceilings = (self.max_utilisation, self.max_utilisation_with_pausing)
        if not all(0 < u <= 1 for u in ceilings) or not 0 < self.down_ttft_fraction < 1:
            raise ValueError("need 0 < max utilisations <= 1 and 0 < down TTFT fraction < 1")
        if not (self.down_window_s >= 0 and self.up_window_s >= 0):
            raise ValueError("need up and down windows >= 0 s")
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"interval must be > 0 s, got {self.interval_s}")

    def whole_intervals(self, window_s: float) -> float:
        """A window rounded up to whole intervals."""
        return math.ceil(window_s / self.interval_s - 1e-9) * self.interval_s

    def is_covered(self, oldest: float, now: float, window_s: float) -> bool:
        """Whether recommendations since ``oldest`` span the window, within half an interval."""
        return now - oldest >= self.whole_intervals(window_s) - self.interval_s / 2
