"""The knob tuner (docs/design.md#tuner): (bounds, knobs in force, pool stats) -> new knobs.

Pure and deterministic: the operator calls :func:`tune` once per stats interval and
persists :class:`TunerState` in ``status.tuning`` so a restart resumes the same
cooldown and hysteresis. The simulator calls the same function (``genpool sim
--tune``).

The SLO (mode ``target_output_tps``) lets ``eps`` of the requests fall below T. The
rules, in priority order (each must be proposed ``confirm_rounds`` fresh rounds in a
row, then the knobs freeze for ``cooldown_intervals`` rounds):

1. mostly sacrificed victims -> lower the cap (the policy is spending SLO budget);
2. below-T above eps, or negative credit, while the pauses are implicated -> lower;
3. below-T under ``eps - dead_band`` (budget unspent) while waiters are at risk and
   the cap binds -> raise the cap (and the headroom with it, so P <= H);
4. below-T above eps while the cap binds but every victim is a laxity victim -> raise;
5. headroom above the cap for ``shrink_rounds`` rounds -> give headroom back.

Headroom is memory too (docs/design.md#kv-blocks): a pause frees no KV block, so a raise
(rules 3 and 4) is held, with reason ``hold-kv-bound``, while the pool's KV use is at
``kv_full`` (no waiter's blocks fit: more paused slots would admit no one) or the paused
requests already hold ``max_paused_kv_share`` of the KV cache.

"Implicated" (rules 2 and 4, ``guarded=True``) is our refinement of docs/design.md#tuner: laxity
victims are resumed before their laxity runs out, so when (nearly) all victims are
laxity victims the misses come from queueing, and the simulator shows that a lower
cap then *raises* below-T (docs/results.md). ``guarded=False`` is the literal rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from genpool_core.aggregate import PoolStats
from genpool_core.field_help import DESCRIPTION
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.names import SLO_MODE


@dataclass(frozen=True, slots=True)
class TunerSettings:
    """The tuner's thresholds, steps, hysteresis and cooldown; a round is one stats
    interval (its window: the stat lines since the last round)."""

    eps: float = field(
        default=0.2,
        metadata={
            DESCRIPTION: "eps: the share of requests the SLO lets fall below T, unitless,"
            " in (0, 1) (0.2: 20% of the requests)"
        },
    )
    dead_band: float = field(
        default=0.05,
        metadata={
            DESCRIPTION: "the cap is raised for unspent budget only while below-T is under"
            " eps - dead_band, so it does not flap around eps; a share of requests, unitless"
        },
    )
    step_fraction: float = field(
        default=0.25,
        metadata={
            DESCRIPTION: "a step moves a knob by this fraction of its value (at least"
            " min_step), unitless"
        },
    )
    min_step: int = field(
        default=1, metadata={DESCRIPTION: "the smallest step a knob moves by, requests"}
    )
    bind_fraction: float = field(
        default=0.8,
        metadata={
            DESCRIPTION: "the cap binds when paused >= this fraction of P (or P turned over"
            " twice in the window), unitless"
        },
    )
    min_completions: int = field(
        default=20,
        metadata={
            DESCRIPTION: "fewer completions than this in the window: below-T is noise and"
            " no rule uses it, requests"
        },
    )
    min_victims: int = field(
        default=4,
        metadata={
            DESCRIPTION: "fewer victims (requests picked to pause) than this in the window:"
            " the victim mix is noise and no rule uses it, count"
        },
    )
    implicated_share: float = field(
        default=0.5,
        metadata={
            DESCRIPTION: "guarded rule: the pauses are implicated in the misses when at least"
            " this share of the window's victims are below-target or sacrificed, unitless"
        },
    )
    sacrificed_share: float = field(
        default=0.5,
        metadata={
            DESCRIPTION: "at least this share of the window's victims sacrificed (mostly"
            " sacrificed) lowers the cap, unitless"
        },
    )
    confirm_rounds: int = field(
        default=2,
        metadata={
            DESCRIPTION: "fresh rounds in a row a cap change must be proposed before it"
            " applies (hysteresis), rounds"
        },
    )
    shrink_rounds: int = field(
        default=4,
        metadata={
            DESCRIPTION: "fresh rounds in a row headroom above the cap must go unused before"
            " it is given back, rounds"
        },
    )
    cooldown_intervals: int = field(
        default=2,
        metadata={
            DESCRIPTION: "tuner rounds without a change after a change (a clamp to the bounds"
            " included); rounds with stale stats do not count; 0: none"
        },
    )
    kv_full: float = field(
        default=0.95,
        metadata={
            DESCRIPTION: "the workers' mean KV-cache use at which a raise of the cap is held:"
            " a pause frees no block, so more paused slots admit no one, unitless, in (0, 1]"
        },
    )
    max_paused_kv_share: float = field(
        default=0.5,
        metadata={
            DESCRIPTION: "the share of the KV cache paused requests may hold before a raise of"
            " the cap is held, unitless, in (0, 1]"
        },
    )
    guarded: bool = field(
        default=True,
        metadata={
            DESCRIPTION: "lower the cap on misses (below-T above eps, or negative credit)"
            " only when the pauses are implicated (implicated_share), and raise it on"
            " queueing misses instead; off: the literal rule of docs/design.md#tuner, lower"
            " on any miss"
        },
    )

    def __post_init__(self) -> None:
        if not 0 < self.eps < 1 or not 0 <= self.dead_band < self.eps:
            raise ValueError("need 0 < eps < 1 and 0 <= dead_band < eps")
        if self.min_step < 1 or not 0 <= self.step_fraction <= 1:
            raise ValueError("need min_step >= 1 and 0 <= step_fraction <= 1")
        if min(self.confirm_rounds, self.shrink_rounds) < 1 or self.cooldown_intervals < 0:
            raise ValueError("need confirm/shrink rounds >= 1 and cooldown >= 0")
        if not (0 < self.kv_full <= 1 and 0 < self.max_paused_kv_share <= 1):
            raise ValueError("need 0 < kv_full <= 1 and 0 < max_paused_kv_share <= 1")


@dataclass(frozen=True, slots=True)
class TunerState:
    cooldown_remaining: int = 0
    pending_reason: str = ""  # the change proposed in the last fresh rounds...
    pending_rounds: int = 0  # ...and for how many in a row

    def to_status(self) -> dict[str, object]:
        return {
            "cooldownRemaining": self.cooldown_remaining,
            "pendingReason": self.pending_reason,
            "pendingRounds": self.pending_rounds,
        }

    @classmethod
    def from_status(cls, status: Mapping[str, object] | None) -> TunerState:
        """Tolerant: a missing or hand-edited status restarts the counters at zero."""
        if not isinstance(status, Mapping):
            return cls()
        reason = status.get("pendingReason")
        return cls(
            cooldown_remaining=_count(status.get("cooldownRemaining")),
            pending_reason=reason if isinstance(reason, str) else "",
            pending_rounds=_count(status.get("pendingRounds")),
        )


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(0, min(int(value), 10_000))


@dataclass(frozen=True, slots=True)
class Decision:
    knobs: Knobs
    reason: str
    changed: bool
    state: TunerState


def _step(value: int, settings: TunerSettings) -> int:
    return max(settings.min_step, math.ceil(settings.step_fraction * value))


def _raised(knobs: Knobs, bounds: KnobBounds, settings: TunerSettings) -> Knobs:
    cap = knobs.paused_cap + _step(knobs.paused_cap, settings)
    return bounds.clamp(Knobs(max(knobs.resident_headroom, cap), cap))


def _lowered(knobs: Knobs, bounds: KnobBounds, settings: TunerSettings) -> Knobs:
    cap = knobs.paused_cap - _step(knobs.paused_cap, settings)
    return bounds.clamp(Knobs(knobs.resident_headroom, cap))


def _shrunk(knobs: Knobs, bounds: KnobBounds, settings: TunerSettings) -> Knobs:
    headroom = knobs.resident_headroom - _step(knobs.resident_headroom, settings)
    return bounds.clamp(Knobs(max(headroom, knobs.paused_cap), knobs.paused_cap))


def _cap_binds_with_waiters_at_risk(stats: PoolStats, settings: TunerSettings) -> bool:
    """The cap is (nearly) full while waiters are at risk.

    ``at_risk`` is a snapshot and at-risk waiters are admitted within a pass or two,
    so a full cap with a queue and pauses in the window (the policy only pauses for
    an at-risk waiter) counts as "at risk" too.
    """
    # A snapshot of a small cap is often caught between pauses, so a cap that turned
    # over at least twice in the window binds as well.
    cap = stats.paused_cap
    turned_over = cap > 0 and stats.pauses_window >= 2 * cap
    full = stats.paused >= settings.bind_fraction * cap or turned_over
    at_risk = stats.at_risk > 0 or (stats.waiters > 0 and stats.pauses_window > 0)
    return full and at_risk


def _is_kv_bound(stats: PoolStats, settings: TunerSettings) -> bool:
    """KV memory, not the cap, limits what another pause could admit (no KV budget
    reported: never)."""
    is_full = stats.kv_used is not None and stats.kv_used >= settings.kv_full
    is_pinned = stats.kv_paused is not None and stats.kv_paused >= settings.max_paused_kv_share
    return is_full or is_pinned


def _proposal(knobs: Knobs, stats: PoolStats, settings: TunerSettings) -> str:
    """The rule that fires on this round's stats, or ``""`` (see the module doc)."""
    eps = settings.eps
    enough = stats.completed_window >= settings.min_completions
    below = stats.below_target_window if enough else None
    mix_known = stats.victims_window >= settings.min_victims
    implicated = not settings.guarded or (
        mix_known and stats.victim_share("below_target", "sacrificed") >= settings.implicated_share
    )
    binds = _cap_binds_with_waiters_at_risk(stats, settings)
    unspent = below is not None and below < eps - settings.dead_band
    missing = below is not None and below > eps
    credit_negative = stats.credit_sum is not None and stats.credit_sum < 0
    if mix_known and stats.victim_share("sacrificed") >= settings.sacrificed_share:
        return "lower-cap-sacrificed"
    if missing and implicated:
        return "lower-cap-below-target"
    if credit_negative and not unspent and implicated:
        return "lower-cap-negative-credit"
    would_raise = binds and (unspent or (missing and settings.guarded))
    if would_raise and _is_kv_bound(stats, settings):
        return "hold-kv-bound"
    if binds and unspent:
        return "raise-cap-budget-unspent"
    if binds and missing and settings.guarded:
        return "raise-cap-queueing-misses"
    if knobs.resident_headroom > knobs.paused_cap:  # pauses never use headroom above P
        return "shrink-headroom-unused"
    return ""


def _apply(reason: str, knobs: Knobs, bounds: KnobBounds, settings: TunerSettings) -> Knobs:
    if reason.startswith("lower-cap"):
        return _lowered(knobs, bounds, settings)
    if reason.startswith("raise-cap"):
        return _raised(knobs, bounds, settings)
    if reason == "shrink-headroom-unused":
        return _shrunk(knobs, bounds, settings)
    return knobs


def tune(
    knobs: Knobs,
    bounds: KnobBounds,
    stats: PoolStats | None,
    state: TunerState,
    settings: TunerSettings,
    *,
    stale: bool,
) -> Decision:
    """One tuner round. ``knobs`` are the per-worker values in force."""
    fresh = TunerState()  # no cooldown, no pending proposal
    clamped = bounds.clamp(knobs)
    if clamped != knobs:  # the bounds are the user's spec: obey at once, cooldown or not
        cooled = replace(fresh, cooldown_remaining=settings.cooldown_intervals)
        return Decision(clamped, "clamp-to-bounds", True, cooled)
    if stale or stats is None:  # freeze; a stale round neither cools down nor confirms
        return Decision(knobs, "stats-stale", False, replace(state, pending_rounds=0))
    if state.cooldown_remaining > 0:
        cooling = replace(fresh, cooldown_remaining=state.cooldown_remaining - 1)
        return Decision(knobs, "hold-cooldown", False, cooling)
    if stats.mode != SLO_MODE:
        return Decision(knobs, "hold-not-slo-mode", False, fresh)
    reason = _proposal(knobs, stats, settings)
    target = _apply(reason, knobs, bounds, settings)
    if not reason or target == knobs:  # nothing to do, or already at the bound
        return Decision(knobs, reason if reason.startswith("hold") else "hold", False, fresh)
    rounds = state.pending_rounds + 1 if reason == state.pending_reason else 1
    needed = settings.shrink_rounds if reason.startswith("shrink") else settings.confirm_rounds
    if rounds < needed:
        return Decision(knobs, "hold-hysteresis", False, TunerState(0, reason, rounds))
    cooled = replace(fresh, cooldown_remaining=settings.cooldown_intervals)
    return Decision(target, reason, True, cooled)
