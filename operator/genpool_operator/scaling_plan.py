"""The replica half of the GenPool mapping: the scaler's settings from the spec, the
replicas in force, and what a round's replica decision writes to the status.

The decision itself is the pool controller's (:mod:`genpool_core.controller`, which calls
:func:`genpool_core.scaler.scale`); this module only maps the GenPool to it and back.

With ``autoscaling.enabled`` the truth about replicas is ``status.desiredReplicas``:
the round writes it and sets the StatefulSet to it, and a reconcile renders the
StatefulSet from :func:`desired_replicas` so it never puts ``spec.replicas`` back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genpool_core.controller import RoundDecision
from genpool_core.names import PreemptionMode
from genpool_core.scaler import ScalerSettings
from genpool_core.slo_check import SloVerdict
from genpool_operator.conditions import Condition
from genpool_operator.spec import GenPoolSpec

SLO_MET = "SLOMet"


def recorded_desired(status: Mapping[str, Any] | None) -> int | None:
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
    start = recorded_desired(status)
    return min(max(spec.replicas if start is None else start, auto.min_replicas), auto.max_replicas)


def spec_in_force(spec: GenPoolSpec, status: Mapping[str, Any] | None) -> GenPoolSpec:
    """``spec`` with the replicas the children must have (for the reconcile handler)."""
    replicas = desired_replicas(spec, status)
    return spec if replicas == spec.replicas else spec.model_copy(update={"replicas": replicas})


def scaler_settings(spec: GenPoolSpec) -> ScalerSettings:
    """The scaler's settings from the spec (autoscaling enabled, so slo and max are set);
    everything the spec does not set is the law's default, as in the simulator."""
    slo, auto = spec.slo, spec.autoscaling
    assert slo is not None and auto.max_replicas is not None
    has_attainment = spec.preemption.kind is PreemptionMode.TARGET_OUTPUT_TPS
    return ScalerSettings(
        ttft_p90_s=slo.ttft_p90_seconds,
        min_replicas=auto.min_replicas,
        max_replicas=auto.max_replicas,
        max_batch=spec.engine.max_batch_size,
        attainment=slo.attainment if has_attainment else None,
        is_pausing=spec.preemption_on,
        max_step=auto.max_step,
        down_window_s=auto.scale_down_stabilization_seconds,
        up_window_s=auto.scale_up_stabilization_seconds,
        interval_s=float(spec.tuning.interval_seconds),
        startup_s=float(auto.startup_seconds),
        capacity_override=auto.target_utilization,
    )


def was_slo_met(status: Mapping[str, Any]) -> str | None:
    """SLOMet's status as recorded ("True", "False", "Unknown"), else None."""
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == SLO_MET:
            return str(condition.get("status"))
    return None


def slo_condition(verdict: SloVerdict) -> Condition:
    """SLOMet (True, False or Unknown)."""
    return Condition(SLO_MET, verdict.is_met, verdict.reason, verdict.message)


def history_entry(decision: RoundDecision, now_text: str) -> dict[str, Any] | None:
    """The replica change for the shared knob-and-replica history, or None."""
    if not decision.is_replica_news or decision.scaling is None:
        return None
    entry: dict[str, Any] = {
        "time": now_text,
        "reason": decision.scaling.reason,
        "kind": "Replicas",
        "from": {"replicas": decision.replicas_before},
        "to": {"replicas": decision.desired},
    }
    if decision.is_advisory:
        entry["advisory"] = True
    return entry


def scaling_status(
    decision: RoundDecision, scaling: Mapping[str, Any], now_text: str
) -> dict[str, Any]:
    """``status.desiredReplicas`` and ``status.scaling`` after the round."""
    if decision.scaling is None:  # the scaler did not run: what it last wrote stands
        return {}
    record = dict(scaling)
    record["advisory"] = decision.is_advisory
    record["reason"] = decision.scaling.reason
    record["state"] = decision.scaling.state.to_status()
    if decision.scaling.inputs is not None:  # what this decision read (a clamp reads none)
        record["inputs"] = decision.scaling.inputs.to_status()
    if decision.is_replica_news:
        record["lastChange"] = {
            "time": now_text,
            "reason": decision.scaling.reason,
            "from": decision.replicas_before,
            "to": decision.desired,
            "advisory": decision.is_advisory,
        }
    return {"desiredReplicas": decision.desired, "scaling": record}
