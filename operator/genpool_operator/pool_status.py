"""The GenPool status as a reduction: writers record facts, one function derives the rest.

Five writers touch a GenPool's status (the reconcile handler, the StatefulSet mirror,
the InferencePool child, the worker-pod watch and the stats round). Each records only
what it observed, its *facts*: the workload's replica counts
(:class:`WorkloadFacts`, from the StatefulSet, or the replicas in force before one
exists), the Degraded verdict on the spec and the worker pods, and the conditions that
are facts themselves (InferencePoolReady, the round's StatsStale, TuningInSync,
HeadroomAtBound, SLOMet). :func:`reduce_status` then derives, from the facts as now
recorded plus the new ones, everything that depends on more than one of them: phase,
Ready, Progressing, the Ready column. So phase has one definition and one source of
"desired" (the StatefulSet's replicas, which the scaler may have set apart from
``spec.replicas``). Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genpool_operator.conditions import (
    Condition,
    merge_conditions,
    phase,
    readiness_conditions,
    ready_text,
)
from genpool_operator.pod_failures import DEGRADED


@dataclass(frozen=True, slots=True)
class WorkloadFacts:
    """The worker StatefulSet's counts (``desired``: its ``spec.replicas``)."""

    desired: int
    replicas: int = 0
    ready: int = 0
    updated: int = 0

    def to_status(self) -> dict[str, int]:
        return {
            "desired": self.desired,
            "replicas": self.replicas,
            "ready": self.ready,
            "updated": self.updated,
        }

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> WorkloadFacts | None:
        """The facts as recorded, or ``None`` before any were (tolerant of hand edits)."""
        workload = status.get("workload")
        if not isinstance(workload, Mapping):
            return None
        counts = [_count(workload.get(key)) for key in ("desired", "replicas", "ready", "updated")]
        return cls(*counts)


def _count(value: object) -> int:
    is_count = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if is_count else 0  # type: ignore[return-value]


def is_degraded(status: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == DEGRADED and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def reduce_status(
    status: Mapping[str, Any],
    *,
    workload: WorkloadFacts | None = None,
    facts: Sequence[Condition] = (),
    now_text: str,
    observed_generation: int | None,
) -> dict[str, Any]:
    """The status patch: the new facts, and phase, Ready, Progressing and the Ready
    column derived from every fact now known. ``workload`` None: as recorded (with
    none recorded yet, only the facts are written: nothing to derive from)."""
    workload = workload or WorkloadFacts.from_status(status)
    if workload is None:
        merged = merge_conditions(status.get("conditions"), list(facts), now_iso=now_text,
                                  observed_generation=observed_generation)  # fmt: skip
        return {"conditions": merged}
    degraded = next((c for c in facts if c.type == DEGRADED), None)
    is_failing = degraded.status is True if degraded else is_degraded(status)
    derived = readiness_conditions(
        workload.desired, workload.ready, workload.updated, degraded=is_failing
    )
    conditions = merge_conditions(
        status.get("conditions"),
        [*facts, *derived],
        now_iso=now_text,
        observed_generation=observed_generation,
    )
    return {
        "workload": workload.to_status(),
        "replicas": workload.replicas,
        "readyReplicas": workload.ready,
        "ready": ready_text(workload.desired, workload.ready),
        "phase": phase(workload.desired, workload.ready, is_failing),
        "conditions": conditions,
    }


def without_condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """``status`` with one condition type dropped (a fact that no longer holds)."""
    kept = [c for c in status.get("conditions") or [] if c.get("type") != kind]
    return {**status, "conditions": kept}


def is_news(status: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether ``patch`` changes anything but condition timestamps (skip the write if not)."""
    for key, value in patch.items():
        if key == "conditions":
            if _strip_times(status.get(key)) != _strip_times(value):
                return True
        elif status.get(key) != value:
            return True
    return False


def _strip_times(conditions: Any) -> list[tuple[Any, ...]]:
    return [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
        for c in conditions or []
    ]
