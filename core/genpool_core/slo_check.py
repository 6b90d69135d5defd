"""The pool's SLO as measured over the last stats window, and the verdict against a target.

One definition for the operator's ``SLOMet`` condition and the simulator's records: GEN
TTFT p90 from the summed TTFT histogram, attainment = 1 - below-T over the window's
completions. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from genpool_core.aggregate import PoolStats


@dataclass(frozen=True, slots=True)
class SloTarget:
    ttft_p90_s: float
    attainment: float | None  # None: no T in this mode, TTFT alone is judged


@dataclass(frozen=True, slots=True)
class SloMeasure:
    """The SLO as the last window measured it (``None``: no sample of that part)."""

    ttft_p90_s: float | None
    attainment: float | None

    def to_status(self) -> dict[str, float]:
        values = {"ttftP90Seconds": self.ttft_p90_s, "attainment": self.attainment}
        return {key: round(value, 4) for key, value in values.items() if value is not None}


NO_MEASURE = SloMeasure(None, None)


@dataclass(frozen=True, slots=True)
class SloVerdict:
    is_met: bool | None  # None: Unknown (no fresh sample)
    reason: str
    message: str


def measure_slo(stats: PoolStats | None) -> SloMeasure:
    if stats is None:
        return NO_MEASURE
    p90 = stats.ttft_p90 if stats.num_first_tokens > 0 else None
    below = stats.below_target_window if stats.completed_window > 0 else None
    return SloMeasure(p90, None if below is None else 1.0 - below)


def slo_verdict(target: SloTarget, measure: SloMeasure) -> SloVerdict:
    """Met, missed, or Unknown without a first token in the window; attainment is
    judged only where the target has one."""
    p90 = measure.ttft_p90_s
    attainment = measure.attainment if target.attainment is not None else None
    if p90 is None:
        return SloVerdict(None, "NoSamples", "no first token in the last stats window")
    text = f"TTFT p90 {p90:.3f}s (target {target.ttft_p90_s}s)"
    if attainment is not None:
        text += f", attainment {attainment:.3f} (target {target.attainment})"
    if p90 > target.ttft_p90_s:
        return SloVerdict(False, "TTFTAboveTarget", text)
    floor = target.attainment
    if attainment is not None and floor is not None and attainment < floor:
        return SloVerdict(False, "AttainmentBelowTarget", text)
    return SloVerdict(True, "WithinTarget", text)
