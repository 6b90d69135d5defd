"""One stats round for one pool as a plan: the GenPool mapped to the pool controller
and its decision mapped back to what to push and what to record, with no I/O.

The decision is :func:`genpool_core.controller.run_round` (the simulator runs the same
one). This module maps the spec to its settings and the status to its state
(:func:`controller_settings`, :func:`controller_state`), and the decision to the live
config pushed with PUT /config, the status patch and the Events. ``statsloop`` gathers
the inputs and does the I/O; everything here is tested without a cluster or a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from genpool_core.controller import (
    ControllerSettings,
    ControllerState,
    Observation,
    RoundDecision,
    run_round,
)
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.live import LiveUpdate
from genpool_core.names import DEFAULT_STAT_INTERVAL_S, PreemptionMode
from genpool_core.scaler import ScalerState
from genpool_core.slo_check import SloTarget
from genpool_core.statline import StatLine
from genpool_core.tuner import TunerSettings, TunerState
from genpool_core.windows import WindowClock
from genpool_operator.conditions import Condition
from genpool_operator.pool_status import reduce_status
from genpool_operator.scaling_plan import (
    history_entry,
    recorded_desired,
    scaler_settings,
    scaling_status,
    slo_condition,
    was_slo_met,
)
from genpool_operator.spec import GenPoolSpec

HISTORY_LIMIT = 10  # status.tuning.history keeps this many knob and replica changes


def round_interval(spec: GenPoolSpec | None) -> float:
    """Seconds between tuning rounds: ``tuning.intervalSeconds``, the CRD's default for an
    invalid spec (its daemon keeps ticking so a fixed spec is picked up)."""
    return float(spec.tuning.interval_seconds if spec else DEFAULT_STAT_INTERVAL_S)


def controller_settings(spec: GenPoolSpec) -> ControllerSettings:
    """The pool controller's settings from the spec."""
    is_slo_mode = spec.preemption.kind is PreemptionMode.TARGET_OUTPUT_TPS
    slo = spec.slo
    tuner = None
    if spec.tuning.enabled and spec.preemption_on:
        tuner = TunerSettings(cooldown_intervals=spec.tuning.cooldown_intervals)
    return ControllerSettings(
        interval_s=round_interval(spec),
        start_replicas=spec.replicas,
        bounds=spec.bounds(),
        start_knobs=spec.start_knobs(),
        is_pausing=spec.preemption_on,
        tuner=tuner,
        scaler=scaler_settings(spec) if spec.autoscaling.enabled else None,
        slo=None if slo is None else SloTarget(
            slo.ttft_p90_seconds, slo.attainment if is_slo_mode else None
        ),
        is_advisory=spec.advisory,
    )  # fmt: skip


def controller_state(spec: GenPoolSpec, status: Mapping[str, Any]) -> ControllerState:
    """The controller's state as the status recorded it (tolerant of anything hand-edited)."""
    tuning = status.get("tuning") or {}
    scaling = status.get("scaling") or {}
    return ControllerState(
        knobs=Knobs.from_json(tuning, spec.start_knobs()) if spec.preemption_on else None,
        replicas=recorded_desired(status),
        tuner=TunerState.from_status(tuning),
        scaler=ScalerState.from_status(scaling.get("state")),
        windows=WindowClock.from_status(status.get("statWindows")),
    )


def live_config(spec: GenPoolSpec, knobs: Knobs) -> dict[str, Any]:
    """PUT /config's values (less the generation): the knobs and the spec's live fields."""
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

    decision: RoundDecision
    update: LiveUpdate  # pushed with PUT /config to every pod not yet in sync
    slo_met_before: str | None = None  # SLOMet's status before the round

    @property
    def live(self) -> dict[str, float | int]:
        """The live values (``status.tuning.liveConfig``)."""
        return self.update.values()

    @property
    def generation(self) -> int:
        return self.update.generation

    @property
    def knobs(self) -> Knobs:
        return self.decision.knobs

    @property
    def is_advisory(self) -> bool:
        return self.decision.is_advisory


@dataclass(frozen=True, slots=True)
class PushOutcome:
    """What pushing ``plan.update`` achieved."""

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
    status: Mapping[str, Any],
    lines: Mapping[str, Sequence[StatLine]],
    *,
    now: float,
    num_ready: int,
    is_deciding: bool = True,
) -> RoundPlan:
    """Run the controller on the pool's recent stat lines (per pod, oldest first) and
    choose the live config and its generation. ``now``: unix seconds (the state is kept
    in the status, so no monotonic clock). ``is_deciding`` False: a wake-up round."""
    settings = controller_settings(spec)
    state = controller_state(spec, status)
    seen = Observation(lines, num_ready, is_deciding)
    decision = run_round(settings, state, seen, now=now)
    live = live_config(spec, decision.knobs)
    generation = desired_generation(status.get("tuning") or {}, live)
    return RoundPlan(decision, LiveUpdate(generation=generation, **live), was_slo_met(status))


def tuning_record(
    tuning_status: Mapping[str, Any], plan: RoundPlan, push: PushOutcome, now_text: str
) -> dict[str, Any]:
    """``status.tuning`` after a round: knobs, sync, tuner state, bounded history."""
    decision, tuning = plan.decision, plan.decision.tuning
    record = dict(tuning_status)
    record.update(
        **plan.knobs.to_json(),
        appliedGeneration=plan.generation,
        liveConfig=plan.live,
        podsInSync=f"{push.num_in_sync}/{push.num_targets}",
    )
    if tuning is not None:
        record.update(tuning.state.to_status())
        record["lastReason"] = tuning.reason
    changes = []
    if tuning is not None and tuning.changed:
        change: dict[str, Any] = {
            "time": now_text,
            "reason": tuning.reason,
            "kind": "Knobs",
            "from": decision.knobs_before.to_json(),
            "to": tuning.knobs.to_json(),
        }
        if decision.is_advisory:
            change["advisory"] = True
        record["lastChange"] = {k: v for k, v in change.items() if k != "kind"}
        changes.append(change)
    replica_change = history_entry(decision, now_text)
    if replica_change is not None:  # one history: the tuner's and the scaler's changes
        changes.append(replica_change)
    if changes:
        history = list(tuning_status.get("history") or [])
        record["history"] = [*history, *changes][-HISTORY_LIMIT:]
    return record


def round_conditions(plan: RoundPlan, push: PushOutcome, bounds: KnobBounds) -> list[Condition]:
    knobs = plan.knobs
    is_at_bound = knobs.resident_headroom >= bounds.max_resident_headroom
    is_synced = push.num_in_sync == push.num_targets
    return [
        _stats_condition(plan.decision, push),
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


def _stats_condition(decision: RoundDecision, push: PushOutcome) -> Condition:
    """StatsStale; a pool where no worker reports has no stats, so they are stale."""
    reporting = decision.stats.workers_reporting if decision.stats else 0
    if reporting == 0:
        message = f"0 of {push.num_targets} ready workers report a stat line"
        return Condition("StatsStale", True, "NoWorkersReporting", message)
    reason = "NoFreshStatLines" if decision.is_stale else "StatLinesFresh"
    return Condition("StatsStale", decision.is_stale, reason, f"{reporting} workers reporting")


def status_patch(
    spec: GenPoolSpec,
    plan: RoundPlan,
    push: PushOutcome,
    status: Mapping[str, Any],
    *,
    observed_generation: int | None,
    now_text: str,
) -> dict[str, Any]:
    """The GenPool status patch, computed against the status as freshly read."""
    decision = plan.decision
    stats = decision.stats
    facts = round_conditions(plan, push, spec.bounds())
    if decision.verdict is not None:
        facts.append(slo_condition(decision.verdict))
    patch: dict[str, Any] = {
        "tuning": tuning_record(dict(status.get("tuning") or {}), plan, push, now_text),
        "workersReporting": stats.workers_reporting if stats else 0,
        "statWindows": decision.state.windows.to_status(),
        **reduce_status(
            status, facts=facts, now_text=now_text, observed_generation=observed_generation
        ),
    }
    if spec.autoscaling.enabled:
        patch.update(scaling_status(decision, status.get("scaling") or {}, now_text))
    elif "desiredReplicas" in status:  # autoscaling turned off: spec.replicas rules again
        patch.update(desiredReplicas=None, scaling=None)  # null deletes in a merge patch
    if decision.fresh_stats is not None:
        patch["preemption"] = decision.fresh_stats.to_status()
        patch["statsUpdatedAt"] = now_text
        patch["slo"] = decision.slo.to_status()
    return patch


def round_events(plan: RoundPlan, push: PushOutcome) -> list[Event]:
    decision = plan.decision
    events = []
    if decision.tuning is not None and decision.tuning.changed:
        events.append(Event("Normal", "Tuned", decision.knob_change_text()))
    if decision.is_replica_news:
        reason = "ScaledUp" if decision.desired > decision.replicas_before else "ScaledDown"
        events.append(Event("Normal", reason, decision.replica_change_text()))
    verdict = decision.verdict
    if verdict is not None and verdict.is_met is False and plan.slo_met_before != "False":
        events.append(Event("Warning", "SLOMissed", f"{verdict.reason}: {verdict.message}"))
    if push.errors:
        events.append(Event("Warning", "ConfigPushFailed", push.errors_text()[:1000]))
    return events
