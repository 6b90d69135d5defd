"""The replica scaler: (replicas in force, pool stats, SLO) -> desired replicas.

Beside the knob tuner and fed the same aggregated stat lines: the tuner moves the
pause knobs within seconds, this moves replicas within minutes. Pure and
deterministic; the simulator calls :func:`scale` every stats interval and the
operator will do the same, persisting :class:`ScalerState` in its status.

The SLO has two parts: GEN TTFT p90 (arrival at the GEN worker -> first token)
at most ``ttft_p90_s``, and an attainment (share of requests at or above T) of at
least ``attainment``. ``attainment=None`` is the replica-only planner: TTFT alone.

Rules, first match wins:

1. arrivals outrun completions with a queue -> up to the replicas that, at the
   serving ones' completion rate, serve the window's arrivals and drain the queue
   (even while others start: the count is absolute);
2. the window's load (batch, paused, waiting) is above the utilisation ceiling of
   the replicas -> up to the replicas that hold it under the ceiling (absolute too);
3. TTFT p90 misses and the knobs cannot fix it (no knob lever, the cap is at its
   bound, the attainment budget is spent, or the miss is severe) -> up;
4. attainment misses and the misses come from queueing (victims are laxity
   victims, so a lower cap would not help) -> up;
5. the SLO holds with slack -> down to the replicas whose batch positions hold the
   window's load at the utilisation ceiling (higher with the knob lever: pausing
   absorbs the bursts a planner must keep headroom for).

Up acts at once (but not while replicas are still starting), as far as every
recommendation over the last ``up_window_s`` asked; an up for load alone (rules 1 and
2) while the SLO holds waits for a second window in a row, so a single burst (or the
waiters a drained replica hands back) does not buy replicas the down window then keeps
for minutes. Down only when every recommendation over the last ``down_window_s``
agrees (Kubernetes HPA's stabilisation windows). Never outside [min, max], never more
than ``max_step``.

Rounds come every ``interval_s`` plus the round's own time, never exactly on it, so
windows are whole intervals (rounded up: never shorter than asked) and a window is
covered within half an interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from genpool_core.aggregate import PoolStats
from genpool_core.scaler_settings import ScalerSettings as ScalerSettings

OUTRUN = "up-arrivals-outrun-completions"
UTILISATION_HIGH = "up-utilisation-high"
CLAMP = "clamp-to-bounds"
LOAD_UPS = (OUTRUN, UTILISATION_HIGH)  # ups on the window's load, not on an SLO miss


@dataclass(frozen=True, slots=True)
class ScalerState:
    # (time, recommended replicas) over the last down window, oldest first
    recommendations: tuple[tuple[float, int], ...] = ()
    loaded_at: float | None = None  # the last round that asked for more replicas on load

    def to_status(self) -> dict[str, object]:
        return {
            "recommendations": [[t, n] for t, n in self.recommendations],
            "loadedAt": self.loaded_at,
        }

    @classmethod
    def from_status(cls, status: Mapping[str, object] | None) -> ScalerState:
        """Tolerant: anything unreadable restarts the window empty (scale-down waits)."""
        if not isinstance(status, Mapping):
            return cls()
        items = status.get("recommendations")
        if not isinstance(items, list):
            return cls()
        kept = []
        for item in items:
            if isinstance(item, list) and len(item) == 2 and all(_is_number(v) for v in item):
                kept.append((float(item[0]), int(item[1])))
        loaded = status.get("loadedAt")
        return cls(tuple(kept), float(loaded) if _is_number(loaded) else None)  # type: ignore[arg-type]


def _is_number(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    reason: str
    state: ScalerState

    def changed(self, replicas: int) -> bool:
        return self.replicas != replicas


def _up_step(replicas: int, settings: ScalerSettings) -> int:
    return max(1, math.ceil(settings.up_fraction * replicas))


def _ttft_p90(stats: PoolStats, settings: ScalerSettings) -> float | None:
    """The window's GEN TTFT p90, or ``None`` when too few first tokens make it noise."""
    return stats.ttft_p90 if stats.num_first_tokens >= settings.min_samples else None


def _attainment(stats: PoolStats, settings: ScalerSettings) -> float | None:
    if stats.completed_window < settings.min_samples or stats.below_target_window is None:
        return None
    return 1.0 - stats.below_target_window


def _knobs_can_fix_ttft(stats: PoolStats, settings: ScalerSettings) -> bool:
    """The tuner can still trade attainment for TTFT: cap below its bound, budget left."""
    cap_max, target = settings.cap_max, settings.attainment
    if cap_max is None or target is None:  # no knob lever
        return False
    cap_per_worker = stats.paused_cap / max(1, stats.workers_reporting)
    attainment = _attainment(stats, settings)
    has_budget = attainment is None or attainment > target
    return cap_per_worker < cap_max and has_budget


def _misses_from_queueing(stats: PoolStats, settings: ScalerSettings) -> bool:
    """Victims mostly laxity victims (resumed in time): pauses are not the cause."""
    if stats.victims_window < settings.min_victims:
        return True  # barely any pausing: the misses come from waiting
    return stats.victim_share("below_target", "sacrificed") < 0.5


def _has_knob_lever(settings: ScalerSettings) -> bool:
    return settings.cap_max is not None and settings.attainment is not None


def _needed_for_load(stats: PoolStats, settings: ScalerSettings) -> int:
    """Replicas whose batch positions hold the window's load at the utilisation ceiling.

    Throughput is bounded by the batch positions, pausing or not, so the load is the
    mean decode batch plus whoever waits (paused or queued). What pausing changes is
    the margin a pool needs: a burst above the batch is paused through instead of
    queued, so a pool with the knob lever runs closer to full
    (``max_utilisation_with_pausing``). This is where pausing saves replicas.
    """
    batch = stats.batch_mean or 0.0
    load = batch * stats.workers_reporting + stats.paused + stats.waiters
    ceiling = settings.max_utilisation
    if _has_knob_lever(settings):
        ceiling = settings.max_utilisation_with_pausing
    return math.ceil(load / (ceiling * settings.max_batch))


def _has_slack(stats: PoolStats, settings: ScalerSettings) -> bool:
    """The SLO holds with room to spare (a quiet window with no first tokens does too)."""
    p90 = _ttft_p90(stats, settings)
    if p90 is not None and p90 > settings.down_ttft_fraction * settings.ttft_p90_s:
        return False
    attainment = _attainment(stats, settings)
    return settings.attainment is None or attainment is None or attainment >= settings.attainment


def recommend(replicas: int, stats: PoolStats, settings: ScalerSettings) -> tuple[int, str]:
    """This round's recommendation and why, before stabilisation and bounds."""
    p90 = _ttft_p90(stats, settings)
    ttft_miss = p90 is not None and p90 > settings.ttft_p90_s
    completions = max(1, stats.completed_window)
    falling_behind = (
        stats.arrivals_window > (1 + settings.outrun_margin) * completions
        and stats.waiters >= settings.min_waiters_per_replica * stats.workers_reporting
    )
    if falling_behind:  # an absolute count: serve the arrivals and drain the queue
        per_replica = completions / max(1, stats.num_windows)  # per pod window
        needed = math.ceil((stats.arrivals_window + stats.waiters) / per_replica)
        if needed > replicas:  # else the replicas starting already cover it
            return needed, OUTRUN
    needed = _needed_for_load(stats, settings)
    if needed > replicas:  # above the utilisation ceiling: up before the queue forms
        return needed, UTILISATION_HIGH
    if ttft_miss:
        assert p90 is not None
        severe = p90 > settings.severe_factor * settings.ttft_p90_s
        if severe or not _knobs_can_fix_ttft(stats, settings):
            return replicas + _up_step(replicas, settings), "up-ttft-miss"
        return replicas, "hold-knobs-first"
    attainment = _attainment(stats, settings)
    target = settings.attainment
    if target is not None and attainment is not None and attainment < target:
        if _misses_from_queueing(stats, settings):
            return replicas + _up_step(replicas, settings), "up-attainment-miss-queueing"
        return replicas, "hold-knobs-first"
    if needed < replicas and _has_slack(stats, settings):
        return needed, "down-utilisation-low"
    return replicas, "hold"


def _slo_misses(stats: PoolStats, settings: ScalerSettings) -> bool:
    p90, attainment = _ttft_p90(stats, settings), _attainment(stats, settings)
    if p90 is not None and p90 > settings.ttft_p90_s:
        return True
    target = settings.attainment
    return target is not None and attainment is not None and attainment < target


def _recent(
    recommendations: tuple[tuple[float, int], ...], now: float, window_s: float,
    settings: ScalerSettings,
) -> tuple[tuple[float, int], ...]:  # fmt: skip
    """The recommendations of the last ``window_s``: whole intervals, half an interval's
    tolerance for rounds that land late or early."""
    edge = settings.whole_intervals(window_s) + settings.interval_s / 2
    return tuple((t, n) for t, n in recommendations if 0 <= now - t <= edge)


def _stabilised_up(
    replicas: int, target: int, reason: str, stats: PoolStats, settings: ScalerSettings,
    loaded_at: float | None, earlier: tuple[tuple[float, int], ...], now: float,
) -> tuple[int, str]:  # fmt: skip
    """The up target after the up window and the single-burst rule (see the module doc)."""
    is_second = loaded_at is not None and now - loaded_at <= 1.5 * settings.interval_s
    if reason in LOAD_UPS and not is_second and not _slo_misses(stats, settings):
        return replicas, "hold-single-burst"
    if settings.up_window_s > 0:
        recent = _recent(earlier, now, settings.up_window_s, settings)
        if not recent or not settings.is_covered(recent[0][0], now, settings.up_window_s):
            return replicas, "hold-up-window"
        lowest = min(n for _, n in recent)
        if lowest <= replicas:
            return replicas, "hold-up-window"
        target = min(target, lowest)
    return target, reason


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
        return ScaleDecision(bounded, CLAMP, ScalerState(window, state.loaded_at))
    if stats is None:  # no stats: neither up nor down, and the windows restart
        return ScaleDecision(replicas, "stats-missing", ScalerState())
    target, reason = recommend(replicas, stats, settings)
    loaded_at = state.loaded_at
    is_loaded = target > replicas and reason in LOAD_UPS
    state = ScalerState((*window, (now, target)), now if is_loaded else None)
    if target > replicas:
        # Replicas still starting: let them land first, unless the count comes from the
        # serving replicas' throughput (it already accounts for the ones starting).
        if num_ready < replicas and reason not in LOAD_UPS:
            return ScaleDecision(replicas, "hold-starting", state)
        target, reason = _stabilised_up(
            replicas, target, reason, stats, settings, loaded_at, window, now
        )
        up = min(target, replicas + settings.max_step, settings.max_replicas)
        if up == replicas and target > replicas:
            reason = "hold-at-max"
        return ScaleDecision(up, reason, state)
    if target < replicas:
        down_window = _recent(state.recommendations, now, settings.down_window_s, settings)
        if not settings.is_covered(down_window[0][0], now, settings.down_window_s):
            return ScaleDecision(replicas, "hold-down-window", state)
        highest = max(n for _, n in down_window)
        down = min(replicas, max(highest, replicas - settings.max_step, settings.min_replicas))
        return ScaleDecision(down, reason if down < replicas else "hold-down-window", state)
    return ScaleDecision(replicas, reason, state)
