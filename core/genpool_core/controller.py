"""The pool controller: one round of a GEN pool's control loop, as a value.

The operator runs it for every GenPool (its state round-trips through the GenPool's
status; it turns the decision into PUT /config pushes, a status patch, Events, metrics
and the StatefulSet's scale), and the simulator runs the same function with the state
in memory, so the results in docs/results.md are the shipped controller's. It is the
only caller of the knob tuner and the replica scaler.

A round, phase by phase (:func:`run_round`):

1. **windows**: each pod's new stat windows enter the aggregate once
   (:mod:`genpool_core.windows`); stale when none entered for two intervals;
2. **due**: a deciding round (not a wake-up round that only pushes live fields) with a
   new window or stale stats;
3. **tuner's turn** (:func:`genpool_core.tuner.tune`): cooldown, hysteresis, frozen
   while stale;
4. **scaler's turn** (:func:`genpool_core.scaler.scale`): both stabilisation windows,
   jitter-tolerant time, no step on a single burst unless the SLO misses;
5. **SLO verdict** (:mod:`genpool_core.slo_check`) on the fresh window;
6. **advisory**: everything is decided and recorded, nothing is applied.

Pure: no clock (``now`` is passed in; the operator's wall clock, the simulator's time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from genpool_core.aggregate import PoolStats, aggregate
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.scaler import ScaleDecision, ScalerSettings, ScalerState, scale
from genpool_core.slo_check import SloMeasure, SloTarget, SloVerdict, measure_slo
from genpool_core.slo_check import slo_verdict as judge
from genpool_core.statline import StatLine
from genpool_core.tuner import Decision, TunerSettings, TunerState, tune
from genpool_core.windows import PoolWindows, WindowClock, take_windows


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    interval_s: float  # between deciding rounds (the workers' stat interval)
    start_replicas: int  # replicas when no decision is in force (spec.replicas)
    bounds: KnobBounds = field(default_factory=lambda: KnobBounds(0, 0, 0, 0))
    start_knobs: Knobs = field(default_factory=lambda: Knobs(0, 0))
    is_pausing: bool = False  # preemption on: the knobs exist
    tuner: TunerSettings | None = None  # None: the knobs stay where they are
    scaler: ScalerSettings | None = None  # None: the replicas stay where they are
    slo: SloTarget | None = None  # None: no verdict
    is_advisory: bool = False  # decide and record, apply nothing


@dataclass(frozen=True, slots=True)
class ControllerState:
    knobs: Knobs | None = None  # in force; None: the start knobs
    replicas: int | None = None  # the last desired count; None: the start replicas
    tuner: TunerState = field(default_factory=TunerState)
    scaler: ScalerState = field(default_factory=ScalerState)
    windows: WindowClock = field(default_factory=WindowClock)


@dataclass(frozen=True, slots=True)
class Observation:
    """What a round read: each ready pod's recent stat lines, oldest first."""

    lines: Mapping[str, Sequence[StatLine]]
    num_ready: int
    is_deciding: bool = True  # False: a wake-up round, the tuner and scaler sit out


@dataclass(frozen=True, slots=True)
class RoundDecision:
    state: ControllerState  # after the round: persist it
    stats: PoolStats | None  # the pool's aggregate (shown even when stale)
    is_stale: bool
    knobs_before: Knobs
    tuning: Decision | None  # None: the tuner did not run
    replicas_before: int
    scaling: ScaleDecision | None  # None: the scaler did not run
    slo: SloMeasure
    verdict: SloVerdict | None  # None: no SLO target, or nothing new to judge
    is_advisory: bool
    recorded_replicas: int | None = None  # the desired count recorded before the round
    has_new_windows: bool = False  # some pod's window entered this round

    @property
    def knobs(self) -> Knobs:
        """The knobs in force after the round (advice is not applied)."""
        if self.tuning is None or self.is_advisory:
            return self.knobs_before
        return self.tuning.knobs

    @property
    def desired(self) -> int:
        """The scaler's count (with advisory: its advice)."""
        return self.scaling.replicas if self.scaling else self.replicas_before

    @property
    def is_replica_news(self) -> bool:
        """A replica change worth an Event and a history entry (advisory: new advice)."""
        if self.scaling is None or self.desired == self.replicas_before:
            return False
        return not self.is_advisory or self.desired != self.recorded_replicas

    def replica_change_text(self) -> str:
        """``up-forecast: replicas 1 -> 2 (forecast 3.10 req/s, capacity ...)``, with the
        numbers the scaler decided on (advice says so)."""
        reason = self.scaling.reason if self.scaling else ""
        text = f"{reason}: replicas {self.replicas_before} -> {self.desired}"
        if self.scaling is not None and self.scaling.inputs is not None:
            text = f"{text} ({self.scaling.inputs.text()})"
        return f"advisory, not applied: {text}" if self.is_advisory else text

    def knob_change_text(self) -> str:
        """``raise-cap-budget-unspent: headroom 1 -> 2, cap 1 -> 2`` (advice says so)."""
        if self.tuning is None:
            return ""
        before, after = self.knobs_before, self.tuning.knobs
        text = (
            f"{self.tuning.reason}: headroom {before.resident_headroom} -> "
            f"{after.resident_headroom}, cap {before.paused_cap} -> {after.paused_cap}"
        )
        return f"advisory, not applied: {text}" if self.is_advisory else text

    @property
    def fresh_stats(self) -> PoolStats | None:
        """The stats to show: fresh, and over windows this round counted."""
        return self.stats if self.has_new_windows and not self.is_stale else None


def knobs_in_force(settings: ControllerSettings, state: ControllerState) -> Knobs:
    """The last knobs (or the start ones) within the current bounds; none without pausing."""
    if not settings.is_pausing:
        return settings.start_knobs
    return settings.bounds.clamp(state.knobs or settings.start_knobs)


def replicas_in_force(settings: ControllerSettings, state: ControllerState) -> int:
    """What runs: the last desired count, or the start replicas (advice never runs)."""
    if state.replicas is None or settings.is_advisory:
        return settings.start_replicas
    return state.replicas


def run_round(
    settings: ControllerSettings, state: ControllerState, seen: Observation, *, now: float
) -> RoundDecision:
    """One round (module doc). Pure; the caller applies and persists the result."""
    windows = take_windows(state.windows, seen.lines, now=now, interval_s=settings.interval_s)
    stats = aggregate(windows.latest, windows.new)
    fresh = None if windows.is_stale else stats
    is_news = windows.is_stale or windows.has_new  # something to decide or judge on
    is_due = seen.is_deciding and is_news
    before = knobs_in_force(settings, state)
    tuning = _tuner_turn(settings, state, before, stats, windows, is_due)
    replicas = replicas_in_force(settings, state)
    scaling = None
    if is_due and settings.scaler is not None:
        scaling = scale(replicas, seen.num_ready, fresh, settings.scaler, state.scaler, now)
    # Judged on new windows only: a round that counted none (a wake-up, or early) has
    # nothing to judge and leaves the last verdict standing; stale stats are Unknown.
    measure = measure_slo(fresh if windows.has_new else None)
    verdict = judge(settings.slo, measure) if settings.slo is not None and is_news else None
    knobs_after = tuning.knobs if tuning is not None and not settings.is_advisory else before
    after = ControllerState(
        knobs=knobs_after if settings.is_pausing else None,
        replicas=scaling.replicas if scaling is not None else state.replicas,
        tuner=tuning.state if tuning is not None else state.tuner,
        scaler=scaling.state if scaling is not None else state.scaler,
        windows=windows.clock if seen.is_deciding else state.windows,
    )
    return RoundDecision(
        after, stats, windows.is_stale, before, tuning, replicas, scaling, measure, verdict,
        settings.is_advisory, state.replicas, windows.has_new,
    )  # fmt: skip


def _tuner_turn(
    settings: ControllerSettings,
    state: ControllerState,
    before: Knobs,
    stats: PoolStats | None,
    windows: PoolWindows,
    is_due: bool,
) -> Decision | None:
    if not is_due or settings.tuner is None or not settings.is_pausing:
        return None
    return tune(before, settings.bounds, stats, state.tuner, settings.tuner, stale=windows.is_stale)
