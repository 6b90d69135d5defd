"""One stats round for one pool as a plan: what to push and what to record, with no I/O.

``statsloop`` gathers the inputs (the pool's stat lines), calls :func:`plan_round`,
pushes ``plan.live`` to the pods, then writes :func:`status_patch` and posts
:func:`round_events`. Everything a round decides is here, so it is tested without
a cluster, pods or a clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from genpool_core import tuner
from genpool_core.aggregate import PoolStats, aggregate
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.names import DEFAULT_STAT_INTERVAL_S
from genpool_core.statline import StatLine
from genpool_operator.conditions import Condition, merge_conditions
from genpool_operator.freshness import LineClock, observe
from genpool_operator.scaling_plan import (
    PoolView,
    ScalingPlan,
    SloMeasure,
    SloVerdict,
    history_entry,
    measure_slo,
    merge_slo_condition,
    plan_scaling,
    scaling_status,
    slo_verdict,
    was_slo_met,
)
from genpool_operator.spec import GenPoolSpec

HISTORY_LIMIT = 10  # status.tuning.history keeps this many knob and replica changes


def round_interval(spec: GenPoolSpec | None) -> float:
    """Seconds between tuning rounds: ``tuning.intervalSeconds``, the CRD's default for an
    invalid spec (its daemon keeps ticking so a fixed spec is picked up)."""
    return float(spec.tuning.interval_seconds if spec else DEFAULT_STAT_INTERVAL_S)


def knobs_in_force(spec: GenPoolSpec, tuning_status: Mapping[str, Any]) -> Knobs:
    """The tuner's last knobs (status survives restarts), else the spec's start values,
    clamped into the spec's current bounds."""
    start = spec.start_knobs()
    if not spec.preemption_on:
        return start
    return spec.bounds().clamp(Knobs.from_json(tuning_status, start))


def live_config(spec: GenPoolSpec, knobs: Knobs) -> dict[str, Any]:
    """PUT /config's body (less the generation): the knobs and the spec's live fields."""
    return {
        "resident_headroom": knobs.resident_headroom,
        "paused_cap": knobs.paused_cap,
        **spec.live_config(),
    }


def desired_generation(tuning_status: Mapping[str, Any], live: Mapping[str, Any]) -> int:
    """A new config generation whenever the live values change; workers refuse older ones."""
    generation = int(tuning_status.get("appliedGeneration", 0))
    return generation if tuning_status.get("liveConfig") == live else generation + 1


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """What one round decided before it touched a pod."""

    seen: LineClock
    stats: PoolStats | None
    is_stale: bool
    decision: tuner.Decision | None  # None: the tuner did not run this round
    knobs_before: Knobs
    bounds: KnobBounds
    live: dict[str, Any]  # pushed with PUT /config to every pod not yet in sync
    generation: int
    scaling: ScalingPlan | None = None  # None: autoscaling off
    slo: SloMeasure = field(default_factory=lambda: SloMeasure(None, None))
    verdict: SloVerdict | None = None  # None: no spec.slo
    slo_met_before: str | None = None  # SLOMet's status before the round
    is_advisory: bool = False  # decide and record, apply nothing

    @property
    def knobs(self) -> Knobs:
        """The knobs in force after the round (an advisory decision is not applied)."""
        if self.decision is None or self.is_advisory:
            return self.knobs_before
        return self.decision.knobs

    def change_text(self) -> str:
        """``raise-cap-budget-unspent: headroom 1 -> 2, cap 1 -> 2`` for Events."""
        if self.decision is None:
            return ""
        before, after = self.knobs_before, self.decision.knobs
        text = (
            f"{self.decision.reason}: headroom {before.resident_headroom} -> "
            f"{after.resident_headroom}, cap {before.paused_cap} -> {after.paused_cap}"
        )
        return f"advisory, not applied: {text}" if self.is_advisory else text


@dataclass(frozen=True, slots=True)
class PushOutcome:
    """What pushing ``plan.live`` achieved."""

    num_in_sync: int
    num_targets: int
    errors: Mapping[str, str] = field(default_factory=dict)  # by pod

    def errors_text(self) -> str:
        """``pod-0: refused; pod-1: timeout`` (empty when every push worked)."""
        return "; ".join(f"{pod}: {error}" for pod, error in sorted(self.errors.items()))


@dataclass(frozen=True, slots=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def plan_round(
    spec: GenPoolSpec,
    tuning_status: Mapping[str, Any],
    lines: Mapping[str, StatLine],
    seen: LineClock,
    *,
    now: float,
    tune: bool,
    pool: PoolView | None = None,
) -> RoundPlan:
    """Aggregate, tune and scale (when ``tune`` and a line is new or the stats went
    stale), and choose the live config and its generation. ``pool``: the status, ready
    pods and wall clock the scaler needs (none: an empty status)."""
    pool = pool or PoolView({})
    fresh = observe(seen, lines, now=now, interval=round_interval(spec))
    stats = aggregate(list(lines.values()))
    before = knobs_in_force(spec, tuning_status)
    bounds = spec.bounds()
    decision = None
    is_due = tune and (fresh.is_stale or fresh.has_advanced)
    if is_due and spec.tuning.enabled and spec.preemption_on:
        state = tuner.TunerState.from_status(tuning_status)
        settings = tuner.TunerSettings(cooldown_intervals=spec.tuning.cooldown_intervals)
        decision = tuner.tune(before, bounds, stats, state, settings, stale=fresh.is_stale)
    knobs = decision.knobs if decision and not spec.advisory else before
    live = live_config(spec, knobs)
    generation = desired_generation(tuning_status, live)
    fresh_stats = None if fresh.is_stale else stats
    measure = measure_slo(fresh_stats)
    return RoundPlan(
        fresh.seen, stats, fresh.is_stale, decision, before, bounds, live, generation,
        scaling=plan_scaling(spec, pool, fresh_stats, is_due=is_due),
        slo=measure,
        verdict=slo_verdict(spec, measure),
        slo_met_before=was_slo_met(pool.status),
        is_advisory=spec.advisory,
    )  # fmt: skip


def tuning_record(
    tuning_status: Mapping[str, Any], plan: RoundPlan, push: PushOutcome, now_text: str
) -> dict[str, Any]:
    """``status.tuning`` after a round: knobs, sync, tuner state, bounded history."""
    decision = plan.decision
    record = dict(tuning_status)
    record.update(
        **plan.knobs.to_json(),
        appliedGeneration=plan.generation,
        liveConfig=plan.live,
        podsInSync=f"{push.num_in_sync}/{push.num_targets}",
    )
    if decision is not None:
        record.update(decision.state.to_status())
        record["lastReason"] = decision.reason
    changes = []
    if decision is not None and decision.changed:
        change: dict[str, Any] = {
            "time": now_text,
            "reason": decision.reason,
            "kind": "Knobs",
            "from": plan.knobs_before.to_json(),
            "to": decision.knobs.to_json(),
        }
        if plan.is_advisory:
            change["advisory"] = True
        record["lastChange"] = {k: v for k, v in change.items() if k != "kind"}
        changes.append(change)
    replica_change = history_entry(plan.scaling, now_text) if plan.scaling else None
    if replica_change is not None:  # one history: the tuner's and the scaler's changes
        changes.append(replica_change)
    if changes:
        history = list(tuning_status.get("history") or [])
        record["history"] = [*history, *changes][-HISTORY_LIMIT:]
    return record


def round_conditions(plan: RoundPlan, push: PushOutcome) -> list[Condition]:
    knobs, bounds = plan.knobs, plan.bounds
    is_at_bound = knobs.resident_headroom >= bounds.max_resident_headroom
    is_synced = push.num_in_sync == push.num_targets
    return [
        _stats_condition(plan, push),
        Condition(
            "TuningInSync",
            is_synced,
            "AllPodsInSync" if is_synced else "PodsOutOfSync",
            push.errors_text()
            or f"{push.num_in_sync}/{push.num_targets} pods at generation {plan.generation}",
        ),
        Condition(
            "HeadroomAtBound",
            is_at_bound,
            "HeadroomAtMax" if is_at_bound else "HeadroomBelowMax",
            f"headroom {knobs.resident_headroom} of max {bounds.max_resident_headroom}",
        ),
    ]


def _stats_condition(plan: RoundPlan, push: PushOutcome) -> Condition:
    """StatsStale; a pool where no worker reports has no stats, so they are stale."""
    reporting = plan.stats.workers_reporting if plan.stats else 0
    if reporting == 0:
        message = f"0 of {push.num_targets} ready workers report a stat line"
        return Condition("StatsStale", True, "NoWorkersReporting", message)
    reason = "NoFreshStatLines" if plan.is_stale else "StatLinesFresh"
    return Condition("StatsStale", plan.is_stale, reason, f"{reporting} workers reporting")


def status_patch(
    plan: RoundPlan,
    push: PushOutcome,
    status: Mapping[str, Any],
    *,
    observed_generation: int | None,
    now_text: str,
) -> dict[str, Any]:
    """The GenPool status patch, computed against the status as freshly read."""
    stats = plan.stats
    conditions = merge_conditions(
        status.get("conditions"),
        round_conditions(plan, push),
        now_iso=now_text,
        observed_generation=observed_generation,
    )
    if plan.verdict is not None:
        conditions = merge_slo_condition(
            conditions, plan.verdict, now_iso=now_text, observed_generation=observed_generation
        )
    patch: dict[str, Any] = {
        "tuning": tuning_record(dict(status.get("tuning") or {}), plan, push, now_text),
        "workersReporting": stats.workers_reporting if stats else 0,
        "conditions": conditions,
    }
    if plan.scaling is not None:
        patch.update(scaling_status(plan.scaling, status.get("scaling") or {}, now_text))
    elif "desiredReplicas" in status:  # autoscaling turned off: spec.replicas rules again
        patch.update(desiredReplicas=None, scaling=None)  # null deletes in a merge patch
    if stats is not None and not plan.is_stale:
        patch["preemption"] = stats.to_status()
        patch["statsUpdatedAt"] = now_text
        patch["slo"] = plan.slo.to_status()
    return patch


def round_events(plan: RoundPlan, push: PushOutcome) -> list[Event]:
    events = []
    if plan.decision is not None and plan.decision.changed:
        events.append(Event("Normal", "Tuned", plan.change_text()))
    scaling = plan.scaling
    if scaling is not None and scaling.is_news:
        reason = "ScaledUp" if scaling.desired > scaling.replicas_before else "ScaledDown"
        events.append(Event("Normal", reason, scaling.change_text()))
    verdict = plan.verdict
    if verdict is not None and verdict.is_met is False and plan.slo_met_before != "False":
        events.append(Event("Warning", "SLOMissed", f"{verdict.reason}: {verdict.message}"))
    if push.errors:
        events.append(Event("Warning", "ConfigPushFailed", push.errors_text()[:1000]))
    return events
