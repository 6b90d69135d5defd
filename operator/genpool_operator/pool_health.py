"""The pool's worker failures in its status: the pods are listed, and
``pod_failures.degraded_condition`` decides Degraded (the reconcile handler uses the
same function, so the two writers agree); ``pool_status.reduce_status`` derives the rest."""

from __future__ import annotations

from typing import Any

from genpool_core.names import pool_label_selector
from genpool_operator.kube import Kube, resource_path
from genpool_operator.pod_failures import PodFailure, degraded_condition, pool_failures
from genpool_operator.pool_status import is_news, reduce_status
from genpool_operator.spec_check import spec_error
from genpool_operator.status import now_iso, update_status


async def worker_failures(kube: Kube, namespace: str, pool: str) -> list[PodFailure]:
    pods = await kube.list(resource_path("v1", "Pod", namespace), pool_label_selector(pool))
    return pool_failures(pods)


class PoolFailures:
    """The pool's worker failures, listed again on each read of the GenPool
    (``update_status(after_read=...)``), so a Degraded written from them is never older
    than the status it replaces: the reconcile handler and the pod watch both write it."""

    def __init__(self, kube: Kube, namespace: str, pool: str) -> None:
        self.kube, self.namespace, self.pool = kube, namespace, pool
        self.failures: list[PodFailure] = []

    async def refresh(self) -> None:
        self.failures = await worker_failures(self.kube, self.namespace, self.pool)


async def record_worker_health(kube: Kube, namespace: str, pool: str) -> None:
    """After a worker pod changed: the Degraded fact from the pool's pods, written only
    when it changes (pods change often; the status need not)."""
    pods = PoolFailures(kube, namespace, pool)
    stamp = now_iso()

    def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any] | None:
        degraded = degraded_condition(spec_error(fresh.get("spec")), pods.failures)
        patch = reduce_status(status, facts=[degraded], now_text=stamp,
                              observed_generation=status.get("observedGeneration"))  # fmt: skip
        return patch if is_news(status, patch) else None

    await update_status(kube, namespace, pool, mutate, after_read=pods.refresh)
