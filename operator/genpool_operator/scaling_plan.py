"""The replica half of a stats round, as a plan: the SLO as measured, and the scaler's call.

Pure like :mod:`genpool_operator.round_plan`, which calls :func:`plan_scaling` and
folds what it returns into the status patch and the round's Events. The decision
itself is :func:`genpool_core.scaler.scale`; this module only feeds it from the
GenPool (settings from the spec, state and replicas in force from the status) and
says what to record.

The scaler's windows count recommendations on a grid: a window is covered when its
oldest recommendation is the window's length old, which rounds never are exactly (they
come every interval plus the round's own time). So the plan hands the scaler a clock
rounded to the interval (:func:`on_the_grid`) and windows rounded up to whole intervals.

With ``autoscaling.enabled`` the truth about replicas is ``status.desiredReplicas``:
the round writes it and sets the StatefulSet to it, and a reconcile renders the
StatefulSet from :func:`desired_replicas` so it never puts ``spec.replicas`` back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from genpool_core.aggregate import PoolStats
from genpool_core.scaler import ScaleDecision, ScalerSettings, ScalerState, scale
from genpool_operator.conditions import Condition, merge_conditions
from genpool_operator.spec import GenPoolSpec

SLO_MET = "SLOMet"
CLAMP_REASON = "clamp-to-bounds"


@dataclass(frozen=True, slots=True)
class PoolView:
    """What a round knows of the pool besides its stat lines."""

    status: Mapping[str, Any]  # the GenPool's status as read at the round's start
    num_ready: int = 0  # ready worker pods (the ones scraped)
    wall_now: float = 0.0  # unix seconds: the scaler's window is persisted, so no monotonic clock


@dataclass(frozen=True, slots=True)
class SloMeasure:
    """The SLO as the last window measured it (``None``: no sample of that part)."""

    ttft_p90_s: float | None
    attainment: float | None

    def to_status(self) -> dict[str, float]:
        values = {"ttftP90Seconds": self.ttft_p90_s, "attainment": self.attainment}
        return {key: round(value, 4) for key, value in values.items() if value is not None}


@dataclass(frozen=True, slots=True)
class SloVerdict:
    is_met: bool | None  # None: Unknown (no fresh sample)
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ScalingPlan:
    """What the scaler decided this round (``decision`` None: it did not run)."""

    replicas_before: int  # the replicas in force when the round began
    decision: ScaleDecision | None
    is_advisory: bool
    previous_desired: int | None  # status.desiredReplicas before the round

    @property
    def desired(self) -> int:
        return self.decision.replicas if self.decision else self.replicas_before

    @property
    def is_news(self) -> bool:
        """A change worth an Event and a history entry (advisory: the advice changed)."""
        if self.decision is None or self.desired == self.replicas_before:
            return False
        return not self.is_advisory or self.desired != self.previous_desired

    def change_text(self) -> str:
        """``up-ttft-miss: replicas 1 -> 2`` (advisory changes say so) for Events."""
        reason = self.decision.reason if self.decision else ""
        text = f"{reason}: replicas {self.replicas_before} -> {self.desired}"
        return f"advisory, not applied: {text}" if self.is_advisory else text


def _recorded_desired(status: Mapping[str, Any] | None) -> int | None:
    value = (status or {}).get("desiredReplicas")
    is_count = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if is_count else None


def is_autoscaled(spec: GenPoolSpec) -> bool:
    """The operator writes the replicas itself (enabled and not advisory)."""
    return spec.autoscaling.enabled and not spec.advisory


def desired_replicas(spec: GenPoolSpec, status: Mapping[str, Any] | None) -> int:
    """The StatefulSet's replicas: ``spec.replicas``, or with autoscaling the scaler's
    ``status.desiredReplicas`` (else ``spec.replicas``) within the spec's bounds."""
    if not is_autoscaled(spec):
        return spec.replicas
    auto = spec.autoscaling
    assert auto.max_replicas is not None  # the spec requires it when enabled
    start = _recorded_desired(status)
    return min(max(spec.replicas if start is None else start, auto.min_replicas), auto.max_replicas)


def spec_in_force(spec: GenPoolSpec, status: Mapping[str, Any] | None) -> GenPoolSpec:
    """``spec`` with the replicas the children must have (for the reconcile handler)."""
    replicas = desired_replicas(spec, status)
    return spec if replicas == spec.replicas else spec.model_copy(update={"replicas": replicas})


def round_interval_s(spec: GenPoolSpec) -> float:
    return float(spec.tuning.interval_seconds)


def on_the_grid(seconds: float, interval_s: float) -> float:
    """``seconds`` rounded to a whole number of intervals."""
    return round(seconds / interval_s) * interval_s


def _whole_intervals(window_s: int, interval_s: float) -> float:
    """A window rounded up to whole intervals: never shorter than the user's."""
    return math.ceil(window_s / interval_s) * interval_s


def scaler_settings(spec: GenPoolSpec) -> ScalerSettings:
    """The scaler's settings from the spec (autoscaling enabled, so slo and max are set)."""
    slo, auto = spec.slo, spec.autoscaling
    assert slo is not None and auto.max_replicas is not None
    has_attainment = spec.preemption.mode == "TargetOutputTps"
    has_knob_lever = spec.preemption_on and spec.tuning.enabled
    settings = ScalerSettings(
        ttft_p90_s=slo.ttft_p90_seconds,
        min_replicas=auto.min_replicas,
        max_replicas=auto.max_replicas,
        max_batch=spec.engine.max_batch_size,
        attainment=slo.attainment if has_attainment else None,
        cap_max=spec.bounds().max_paused_cap if has_knob_lever else None,
        max_step=auto.max_step,
        down_window_s=_whole_intervals(
            auto.scale_down_stabilization_seconds, round_interval_s(spec)
        ),
    )
    ceiling = auto.target_utilization
    if ceiling is None:
        return settings
    return replace(settings, max_utilisation=ceiling, max_utilisation_with_pausing=ceiling)


def _stabilise_up(
    decision: ScaleDecision, replicas: int, window_s: float, now: float
) -> ScaleDecision:
    """Kubernetes HPA's scale-up window: up only as far as every recommendation over
    the last ``window_s`` asked (the scaler itself acts on one round)."""
    if window_s <= 0 or decision.replicas <= replicas or decision.reason == CLAMP_REASON:
        return decision
    recent = [(t, n) for t, n in decision.state.recommendations if now - t <= window_s]
    is_covered = bool(recent) and now - recent[0][0] >= window_s - 1e-6
    lowest = min((n for _, n in recent), default=replicas)
    if not is_covered or lowest <= replicas:
        return replace(decision, replicas=replicas, reason="hold-up-window")
    return replace(decision, replicas=min(decision.replicas, lowest))


def plan_scaling(
    spec: GenPoolSpec, pool: PoolView, stats: PoolStats | None, *, is_due: bool
) -> ScalingPlan | None:
    """The scaler's round (``None`` with autoscaling off). ``stats`` None: stale or none."""
    if not spec.autoscaling.enabled:
        return None
    previous = _recorded_desired(pool.status)
    # Advice is relative to what runs; applied, the recorded count is taken unclamped so
    # that a bounds change shows as the scaler's clamp-to-bounds.
    before = previous if previous is not None and not spec.advisory else spec.replicas
    if not is_due:
        return ScalingPlan(before, None, spec.advisory, previous)
    state = ScalerState.from_status((pool.status.get("scaling") or {}).get("state"))
    settings = scaler_settings(spec)
    interval_s = round_interval_s(spec)
    now = on_the_grid(pool.wall_now, interval_s)
    decision = scale(before, pool.num_ready, stats, settings, state, now)
    window_s = _whole_intervals(spec.autoscaling.scale_up_stabilization_seconds, interval_s)
    decision = _stabilise_up(decision, before, window_s, now)
    return ScalingPlan(before, decision, spec.advisory, previous)


def measure_slo(stats: PoolStats | None) -> SloMeasure:
    if stats is None:
        return SloMeasure(None, None)
    p90 = stats.ttft_p90 if stats.num_first_tokens > 0 else None
    below = stats.below_target_window if stats.completed_window > 0 else None
    return SloMeasure(p90, None if below is None else 1.0 - below)


def slo_verdict(spec: GenPoolSpec, measure: SloMeasure) -> SloVerdict | None:
    """SLOMet against ``spec.slo`` (``None`` without one). Attainment counts only where
    T exists (``preemption.mode: TargetOutputTps``)."""
    slo = spec.slo
    if slo is None:
        return None
    p90, attainment = measure.ttft_p90_s, measure.attainment
    if spec.preemption.mode != "TargetOutputTps":
        attainment = None
    if p90 is None:
        return SloVerdict(None, "NoSamples", "no first token in the last stats window")
    text = f"TTFT p90 {p90:.3f}s (target {slo.ttft_p90_seconds}s)"
    if attainment is not None:
        text += f", attainment {attainment:.3f} (target {slo.attainment})"
    if p90 > slo.ttft_p90_seconds:
        return SloVerdict(False, "TTFTAboveTarget", text)
    if attainment is not None and attainment < slo.attainment:
        return SloVerdict(False, "AttainmentBelowTarget", text)
    return SloVerdict(True, "WithinTarget", text)


def was_slo_met(status: Mapping[str, Any]) -> str | None:
    """SLOMet's status as recorded ("True", "False", "Unknown"), else None."""
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == SLO_MET:
            return str(condition.get("status"))
    return None


def merge_slo_condition(
    conditions: list[dict[str, Any]],
    verdict: SloVerdict,
    *,
    now_iso: str,
    observed_generation: int | None,
) -> list[dict[str, Any]]:
    """Set SLOMet (True, False or Unknown)."""
    update = Condition(SLO_MET, verdict.is_met, verdict.reason, verdict.message)
    return merge_conditions(
        conditions, [update], now_iso=now_iso, observed_generation=observed_generation
    )


def history_entry(plan: ScalingPlan, now_text: str) -> dict[str, Any] | None:
    """The replica change for the shared knob-and-replica history, or None."""
    if not plan.is_news or plan.decision is None:
        return None
    entry: dict[str, Any] = {
        "time": now_text,
        "reason": plan.decision.reason,
        "kind": "Replicas",
        "from": {"replicas": plan.replicas_before},
        "to": {"replicas": plan.desired},
    }
    if plan.is_advisory:
        entry["advisory"] = True
    return entry


def scaling_status(plan: ScalingPlan, scaling: Mapping[str, Any], now_text: str) -> dict[str, Any]:
    """``status.desiredReplicas`` and ``status.scaling`` after the round."""
    if plan.decision is None:  # the scaler did not run: what it last wrote stands
        return {}
    record = dict(scaling)
    record["advisory"] = plan.is_advisory
    record["reason"] = plan.decision.reason
    record["state"] = plan.decision.state.to_status()
    change = history_entry(plan, now_text)
    if change is not None:
        record["lastChange"] = {
            "time": now_text,
            "reason": change["reason"],
            "from": plan.replicas_before,
            "to": plan.desired,
            "advisory": plan.is_advisory,
        }
    return {"desiredReplicas": plan.desired, "scaling": record}
