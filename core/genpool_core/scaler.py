"""The replica scaler: (replicas in force, a pool window, the SLO) -> desired replicas.

A capacity law on the SLO tail (docs/design.md#replica-scaler). Beside the knob tuner
and fed the same aggregated stat lines: the tuner moves the pause knobs within
seconds, this moves replicas within minutes. Pure and deterministic; the pool
controller (:mod:`genpool_core.controller`) calls :func:`scale` every due round, in the
operator and in the simulator alike.

Demand is in batch positions: the forecast arrival rate x the service time (batch
position-seconds per request, which pausing does not change). A replica holds B
positions x its learned capacity (:mod:`genpool_core.scaler_estimates`). Each round:

1. **forecast**: the replicas that hold the forecast demand at the learned capacity; a
   window above the forecast counts at its own rate only if it left a backlog (a burst
   the pause budget absorbed is no demand to buy for);
2. **backlog**: plus the replicas that drain the waiters pausing cannot admit (and what
   the serving replicas fall behind by until new ones serve) within ``drain_s``;
   computed afresh each round, so replicas bought for a queue go as soon as it is gone;
3. **tail**: when the tail signal (two windows' mean) is above ``tail_up``, up in
   proportion, ``n + ceil(n (s / tail_up - 1))`` (llm-d's law), at most doubling, and
   only on a calm window (``Estimates.is_calm``): the safety net when the estimates are
   wrong, not an echo of a surge the other terms already answer;
4. **consolidation**: down only while the tail is below ``tail_down``, no backlog waits,
   the forecast is not climbing past the level, and every round over the down window
   agrees that fewer replicas hold the smoothed demand at the learned capacity.

Up acts at once, as far as every recommendation over ``up_window_s`` asked (0: this
round's). Never outside [min, max] (clamped at once), never more than ``max_step``;
no stats hold and restart the windows (the estimates stay). Rounds come every
``interval_s`` plus the round's own time, so windows are whole intervals (rounded up)
and a window is covered within half an interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from genpool_core.aggregate import PoolStats
from genpool_core.scaler_estimates import Estimates
from genpool_core.scaler_settings import ScalerSettings as ScalerSettings
from genpool_core.scaler_signals import WindowSignals, read_window
from genpool_core.scaler_state import ScaleInputs as ScaleInputs
from genpool_core.scaler_state import ScalerState as ScalerState

CLAMP = "clamp-to-bounds"
UP_FORECAST = "up-forecast"
UP_BACKLOG = "up-backlog"
UP_TAIL = "up-tail"
DOWN = "down-consolidate"
_EPSILON = 1e-9  # demand exactly at a whole number of replicas needs that many
RISING = 0.1  # a forecast this share above the level: the load is still climbing


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    reason: str
    state: ScalerState
    inputs: ScaleInputs | None = None  # None: no window to decide on

    def changed(self, replicas: int) -> bool:
        return self.replicas != replicas


def _demand_positions(
    rate: float, signals: WindowSignals, estimates: Estimates, settings: ScalerSettings
) -> float:
    """Batch positions ``rate`` requests/s keep busy; before any service time is known,
    the positions in use now, scaled by the rate."""
    if estimates.service_s is not None:
        return rate * estimates.service_s
    if signals.occupancy is None or signals.arrival_rate <= 0:
        return 0.0
    busy = signals.occupancy * signals.workers * settings.max_batch
    return busy * rate / signals.arrival_rate


def _replicas_for(positions: float, capacity: float, settings: ScalerSettings) -> int:
    return max(0, math.ceil(positions / (capacity * settings.max_batch) - _EPSILON))


def law_inputs(
    replicas: int, num_ready: int, is_calm: bool, signals: WindowSignals,
    estimates: Estimates, settings: ScalerSettings,
) -> ScaleInputs:  # fmt: skip
    """Each term of the law for this round (module doc), before bounds and windows."""
    capacity = estimates.capacity_in_force(settings)
    forecast = estimates.forecast(settings)
    # A window above the forecast is demand when it left a queue pausing could not admit;
    # one that pausing absorbed (no backlog) was a burst the pool already handled.
    rate = max(forecast, signals.arrival_rate) if signals.backlog > 0 else forecast
    demand = _demand_positions(rate, signals, estimates, settings)
    tail = _mean_tail(estimates.tail, signals.tail)
    # consolidation holds what the smoothed rate (the level) needs; while the forecast
    # still climbs past it (``is_rising``) nothing is consolidated at all, so a ramp's
    # lead is not given back and a step's overshoot is not held by the down window
    level_demand = _demand_positions(estimates.level or 0.0, signals, estimates, settings)
    return ScaleInputs(
        arrival_rate=signals.arrival_rate,
        forecast=forecast,
        service_s=estimates.service_s,
        capacity=capacity,
        occupancy=signals.occupancy,
        tail=tail,
        pause_budget=signals.pause_budget,
        backlog=signals.backlog,
        forecast_replicas=_replicas_for(demand, capacity, settings),
        backlog_replicas=_backlog_replicas(rate, num_ready, signals, estimates, settings),
        tail_replicas=_tail_replicas(replicas, tail, is_calm, settings),
        consolidated=_replicas_for(level_demand, capacity, settings),
        is_rising=forecast > (estimates.level or 0.0) * (1 + RISING),
        per_replica_rate=(
            capacity * settings.max_batch / estimates.service_s if estimates.service_s else None
        ),
    )


def _mean_tail(last: float | None, now: float | None) -> float | None:
    if last is None or now is None:
        return now if last is None else last
    return (last + now) / 2


def _backlog_replicas(
    rate: float, num_ready: int, signals: WindowSignals, estimates: Estimates,
    settings: ScalerSettings,
) -> int:  # fmt: skip
    """Replicas that drain the backlog within the drain time once they serve: the
    waiters pausing cannot admit, plus what the serving replicas fall behind by until
    then (the forecast over what they hold at the learned capacity)."""
    service = estimates.service_s
    if not service or (signals.backlog == 0 and rate <= 0):
        return 0
    capacity = estimates.capacity_in_force(settings)
    served = num_ready * capacity * settings.max_batch / service  # requests/s
    queued = signals.backlog + max(0.0, rate - served) * settings.startup_s
    if signals.backlog == 0:
        return 0
    return _replicas_for(queued * service / settings.drain_s, capacity, settings)


def _tail_replicas(
    replicas: int, tail: float | None, is_calm: bool, settings: ScalerSettings
) -> int:
    """llm-d's proportional step on the tail, at most doubling (the HPA's 100 % a
    period), and only on a calm window (``Estimates.is_calm``): a tail left by a surge,
    or by a queue that replicas just added are draining, is not a new shortage."""
    if tail is None or tail <= settings.tail_up or not is_calm:
        return 0
    step = math.ceil(replicas * (tail / settings.tail_up - 1))
    return replicas + min(replicas, max(1, step))


def recommend(replicas: int, inputs: ScaleInputs, settings: ScalerSettings) -> tuple[int, str]:
    """This round's recommendation and why, before stabilisation and bounds."""
    held = inputs.forecast_replicas + inputs.backlog_replicas
    if inputs.tail_replicas > max(replicas, held):
        return inputs.tail_replicas, UP_TAIL
    if held > replicas:
        is_backlog = inputs.forecast_replicas <= replicas
        return held, UP_BACKLOG if is_backlog else UP_FORECAST
    can_consolidate = (
        inputs.backlog == 0
        and not inputs.is_rising
        and inputs.consolidated < replicas
        and (inputs.tail is None or inputs.tail < settings.tail_down)
    )
    if can_consolidate:
        return inputs.consolidated, DOWN
    return replicas, "hold"


def _recent(
    recommendations: tuple[tuple[float, int], ...], now: float, window_s: float,
    settings: ScalerSettings,
) -> tuple[tuple[float, int], ...]:  # fmt: skip
    """The recommendations of the last ``window_s``: whole intervals, half an interval's
    tolerance for rounds that land late or early."""
    edge = settings.whole_intervals(window_s) + settings.interval_s / 2
    return tuple((t, n) for t, n in recommendations if 0 <= now - t <= edge)


def _up_target(
    replicas: int, target: int, earlier: tuple[tuple[float, int], ...], now: float,
    settings: ScalerSettings,
) -> int:  # fmt: skip
    """As far up as every recommendation over the up window asked (0 s: this round's)."""
    if settings.up_window_s <= 0:
        return target
    recent = _recent(earlier, now, settings.up_window_s, settings)
    if not recent or not settings.is_covered(recent[0][0], now, settings.up_window_s):
        return replicas
    return min(target, min(n for _, n in recent))


def scale(
    replicas: int,
    num_ready: int,
    stats: PoolStats | None,
    settings: ScalerSettings,
    state: ScalerState,
    now: float,
) -> ScaleDecision:
    """One round. ``replicas`` is the desired count in force, ``num_ready`` how many serve."""
    window = _recent(
        state.recommendations, now, max(settings.down_window_s, settings.up_window_s), settings
    )
    bounded = min(max(replicas, settings.min_replicas), settings.max_replicas)
    if bounded != replicas:  # the bounds are the user's spec: obey at once
        return ScaleDecision(bounded, CLAMP, replace(state, recommendations=window))
    if stats is None:  # no stats: neither up nor down, and the windows restart
        return ScaleDecision(replicas, "stats-missing", ScalerState(estimates=state.estimates))
    signals = read_window(stats, settings)
    is_calm = state.estimates.is_calm(signals, num_ready, replicas, settings)
    estimates = state.estimates.updated(signals, settings, num_ready=num_ready, replicas=replicas)
    inputs = law_inputs(replicas, num_ready, is_calm, signals, estimates, settings)
    target, reason = recommend(replicas, inputs, settings)
    state = ScalerState((*window, (now, max(inputs.consolidated, settings.min_replicas))),
                        estimates)  # fmt: skip
    if target > replicas:
        target = _up_target(replicas, target, window, now, settings)
        up = min(target, replicas + settings.max_step, settings.max_replicas)
        if up == replicas:
            reason = "hold-at-max" if target > replicas else "hold-up-window"
        return ScaleDecision(up, reason, state, inputs)
    if target < replicas:
        down_window = _recent(state.recommendations, now, settings.down_window_s, settings)
        if not settings.is_covered(down_window[0][0], now, settings.down_window_s):
            return ScaleDecision(replicas, "hold-down-window", state, inputs)
        highest = max(n for _, n in down_window)
        down = min(replicas, max(highest, replicas - settings.max_step, settings.min_replicas))
        return ScaleDecision(down, reason if down < replicas else "hold-down-window", state,
                             inputs)  # fmt: skip
    return ScaleDecision(replicas, reason, state, inputs)
