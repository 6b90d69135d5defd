"""The replica-law study's loads and settings (``python -m bench.autoscale_study``).

Day-shaped open-loop loads of our own: a low rate L and a peak H = 3 L, Gamma arrivals
(CV 1, 2 or 4), Azure conversation or code lengths. Every shape starts with a warm-up
at L (excluded from the metrics) long enough for every policy to settle, and its rates
are levels of one grid (``levels``), so the oracle's replicas per rate are swept once
per load and reused by every shape.

- ``step``: L, H for 600 s, L (the load of issue 32, a cliff);
- ``ramp``: L, three 90 s steps up, H for 600 s, the steps down, L;
- ``diurnal``: one sine day from L to H and back in 60 s phases, each rounded to a level;
- ``bursts``: L with three bursts to H of 90 s (the actuation delay), 210 s apart.

The burst-length sweep (``burst_shape``) uses bursts to 2 L of a given length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genpool_sim.workload import RatePhase

WARMUP_S = 240.0
LEVELS = 5  # rates L, L + (H - L)/4, ..., H
INTERVAL_S = 30.0
STARTUP_S = 60.0
ACTUATION_S = STARTUP_S + INTERVAL_S  # a decision's wait: start-up, then a round to see it


@dataclass(frozen=True)
class Lengths:
    """A length profile: its trace, its low rate and the context servers it needs."""

    name: str
    trace: str  # "conv" (the shared Azure conversation trace) or a path
    low_rate: float  # L, requests/s: about 2-3 replicas of B = 16
    ctx_servers: int  # enough that the context stage never queues at H


CONV = Lengths("conv", "conv", low_rate=4.0, ctx_servers=4)
CODE = Lengths("code", "bench/data/azure_code_2023_every9th.csv", low_rate=10.0, ctx_servers=48)


@dataclass(frozen=True)
class Load:
    """One study load: shape, lengths, arrival CV, SLO and T."""

    shape: str
    lengths: Lengths = CONV
    cv: float = 2.0
    slo_ttft_s: float = 2.0
    target_output_tps: float = 12.0
    burst_s: float | None = None  # the burst-length sweep's burst
    labels: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        burst = "" if self.burst_s is None else f"-{self.burst_s:g}s"
        return (f"{self.shape}{burst}/{self.lengths.name}/cv{self.cv:g}"
                f"/slo{self.slo_ttft_s:g}/T{self.target_output_tps:g}")  # fmt: skip

    def phases(self) -> list[RatePhase]:
        if self.shape == "bursts2x":
            assert self.burst_s is not None
            return burst_shape(self.lengths.low_rate, self.burst_s)
        return SHAPES[self.shape](self.lengths.low_rate)


def levels(low: float) -> list[float]:
    """The grid every shape's rates are on: L to H = 3 L in LEVELS steps."""
    return [low + (3 * low - low) * k / (LEVELS - 1) for k in range(LEVELS)]


def _lead(low: float) -> list[RatePhase]:
    return [RatePhase(WARMUP_S + 300.0, low)]


def step_shape(low: float) -> list[RatePhase]:
    return [*_lead(low), RatePhase(600.0, 3 * low), RatePhase(300.0, low)]


def ramp_shape(low: float) -> list[RatePhase]:
    grid = levels(low)
    up = [RatePhase(90.0, rate) for rate in grid[1:-1]]
    return [*_lead(low), *up, RatePhase(600.0, grid[-1]), *reversed(up), RatePhase(300.0, low)]


def diurnal_shape(low: float) -> list[RatePhase]:
    grid = levels(low)
    phases = [RatePhase(WARMUP_S, low)]
    for k in range(30):  # one sine day in 30 minutes: trough, peak, trough
        rate = low + (3 * low - low) * (1 - math.cos(2 * math.pi * k / 30)) / 2
        phases.append(RatePhase(60.0, min(grid, key=lambda level: abs(level - rate))))
    return phases


def bursts_shape(low: float) -> list[RatePhase]:
    bursts = [RatePhase(ACTUATION_S, 3 * low), RatePhase(210.0, low)] * 3
    return [*_lead(low), *bursts]


def burst_shape(low: float, burst_s: float) -> list[RatePhase]:
    """Three bursts to 2 L of ``burst_s``, each followed by 300 s at L."""
    bursts = [RatePhase(burst_s, 2 * low), RatePhase(300.0, low)] * 3
    return [*_lead(low), *bursts]


SHAPES = {
    "step": step_shape,
    "ramp": ramp_shape,
    "diurnal": diurnal_shape,
    "bursts": bursts_shape,
}

# every shape at CV 2; the smooth ones also at CV 1 and 4; code lengths on the diurnal day
GOAL_LOADS = [
    *(Load(shape, CONV, 2.0) for shape in SHAPES),
    *(Load(shape, CONV, cv) for shape in ("ramp", "diurnal") for cv in (1.0, 4.0)),
    Load("diurnal", CODE, 2.0),
]
BURST_LENGTHS_S = (30.0, 60.0, 90.0, 180.0, 360.0)
# the sweeps' SLO tightness: multiples of the unloaded GEN TTFT p90 (bench measures it)
TIGHTNESS = (2.0, 4.0, 8.0)
# the sweeps' slack: T as a share of the decode rate (1.0: the falsification control)
SLACK = (0.5, 0.7, 0.9, 1.0)
