"""GenPool status conditions and phase (pure: the caller passes ``now``).

Condition types (docs/design.md#crd): Ready, Progressing, Degraded, StatsStale,
TuningInSync, HeadroomAtBound. Reasons are CamelCase and classified so that
alerting can key on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONDITION_TYPES = (
    "Ready",
    "Progressing",
    "Degraded",
    "StatsStale",
    "TuningInSync",
    "HeadroomAtBound",
)


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool | None  # None: Unknown (e.g. SLOMet with no sample to judge)
    reason: str
    message: str = ""

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else str(self.status)


def merge_conditions(
    current: list[dict[str, Any]] | None,
    updates: list[Condition],
    *,
    now_iso: str,
    observed_generation: int | None,
) -> list[dict[str, Any]]:
    """Apply ``updates``; ``lastTransitionTime`` moves only when the status flips."""
    by_type = {c.get("type"): dict(c) for c in current or [] if isinstance(c, dict)}
    for update in updates:
        status = update.status_text
        previous = by_type.get(update.type)
        flipped = previous is None or previous.get("status") != status
        entry: dict[str, Any] = {
            "type": update.type,
            "status": status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": (
                now_iso if flipped or previous is None else previous.get("lastTransitionTime")
            ),
        }
        if observed_generation is not None:
            entry["observedGeneration"] = observed_generation
        by_type[update.type] = entry
    order = {name: i for i, name in enumerate(CONDITION_TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], 99), c["type"]))


def stalled_progress(desired: int, ready: int) -> Condition:
    """Progressing while workers fail: not progressing (Kubernetes' own convention for a
    rollout that cannot finish), so no one waits on a pool that will never be ready."""
    return Condition(
        "Progressing",
        False,
        "WorkersFailing",
        f"{ready}/{desired} ready; the rollout cannot finish while workers fail (see Degraded)",
    )


def readiness_conditions(
    desired: int, ready: int, updated: int, *, degraded: bool = False
) -> list[Condition]:
    """Ready / Progressing from the StatefulSet's counts (stalled while ``degraded``)."""
    rolling = updated < desired or ready < desired
    if desired == 0:
        ready_cond = Condition("Ready", True, "ScaledToZero", "replicas is 0")
    elif ready >= desired:
        ready_cond = Condition("Ready", True, "AllReplicasReady", f"{ready}/{desired} ready")
    else:
        ready_cond = Condition("Ready", False, "ReplicasNotReady", f"{ready}/{desired} ready")
    if rolling and degraded:
        return [ready_cond, stalled_progress(desired, ready)]
    progressing = Condition(
        "Progressing",
        rolling,
        "RollingOut" if rolling else "Stable",
        f"{updated}/{desired} updated, {ready}/{desired} ready",
    )
    return [ready_cond, progressing]


def phase(desired: int, ready: int, degraded: bool) -> str:
    if degraded:
        return "Degraded"
    if desired == 0:
        return "Idle"
    return "Running" if ready >= desired else "Progressing"


def ready_text(desired: int, ready: int) -> str:
    return f"{ready}/{desired}"
