"""The pool's worker failures in its status: the pods are listed, and
``pod_failures.degraded_condition`` decides Degraded (the reconcile handler uses the
same function, so the two writers agree)."""

from __future__ import annotations

from typing import Any

from genpool_core.names import pool_label_selector
from genpool_operator.builders import statefulset_name
from genpool_operator.conditions import merge_conditions, phase, stalled_progress
from genpool_operator.kube import Kube, resource_path
from genpool_operator.pod_failures import DEGRADED, PodFailure, degraded_condition, pool_failures
from genpool_operator.spec_check import spec_error
from genpool_operator.status import now_iso, update_status


async def worker_failures(kube: Kube, namespace: str, pool: str) -> list[PodFailure]:
    pods = await kube.list(resource_path("v1", "Pod", namespace), pool_label_selector(pool))
    return pool_failures(pods)


async def record_worker_health(kube: Kube, namespace: str, pool: str) -> None:
    """After a worker pod changed: Degraded and phase from the pool's pods, written only
    when they change (pods change often; the status need not)."""
    failures = await worker_failures(kube, namespace, pool)
    # The phase counts replicas as the StatefulSet mirror does: the StatefulSet's, which
    # the replica scaler may have set apart from spec.replicas.
    path = resource_path("apps/v1", "StatefulSet", namespace, statefulset_name(pool))
    desired = int(((await kube.get(path) or {}).get("spec") or {}).get("replicas") or 0)
    stamp = now_iso()

    def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any] | None:
        degraded = degraded_condition(spec_error(fresh.get("spec")), failures)
        current: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == DEGRADED), {}
        )
        now = (degraded.status_text, degraded.reason, degraded.message)
        if (current.get("status"), current.get("reason"), current.get("message")) == now:
            return None
        ready = int(status.get("readyReplicas") or 0)
        updates = [degraded]
        if degraded.status and ready < desired:  # the StatefulSet mirror keeps it after
            updates.append(stalled_progress(desired, ready))
        return {
            "conditions": merge_conditions(
                status.get("conditions"),
                updates,
                now_iso=stamp,
                observed_generation=status.get("observedGeneration"),
            ),
            "phase": phase(desired, ready, degraded.status is True),
        }

    await update_status(kube, namespace, pool, mutate)
