"""Reconcile one GenPool into its children, and mirror the workers' readiness.

Children are rendered by the pure builders and written with server-side apply, so
running this twice (kopf replays every object on start, or an operator restarts
mid-reconcile) converges on the same objects instead of creating duplicates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from genpool_core.names import INFERENCE_POOL_API_VERSION, INFERENCE_POOL_KIND, POOL_LABEL
from genpool_operator.builders import PoolRef, build_children
from genpool_operator.conditions import Condition
from genpool_operator.inference_pool import (
    INFERENCE_POOL_CONDITION,
    applied,
    build_inference_pool,
    crd_not_installed,
    inference_pool_name,
    is_owned_by,
    not_owned,
    rejected,
)
from genpool_operator.kube import Kube, KubeError, object_path, resource_path, with_retries
from genpool_operator.pod_failures import degraded_condition
from genpool_operator.pool_health import PoolFailures
from genpool_operator.pool_status import (
    WorkloadFacts,
    is_news,
    reduce_status,
    without_condition,
)
from genpool_operator.prefill_plan import PrefillCounts, mirror_patch, spec_patch
from genpool_operator.scaling_plan import desired_replicas
from genpool_operator.spec import GenPoolSpec
from genpool_operator.status import now_iso, update_status
from genpool_operator.tiers import is_prefill, prefill_statefulset_name, status_selector

log = logging.getLogger("genpool.operator.reconcile")


@dataclass(frozen=True)
class OperatorOptions:
    worker_image: str
    admin_token: str | None


@dataclass(frozen=True)
class ChildChange:
    kind: str
    name: str
    action: str  # created | updated | unchanged | deleted


def pool_ref(body: dict[str, Any]) -> PoolRef:
    meta = body["metadata"]
    return PoolRef(meta["name"], meta["namespace"], meta["uid"], meta.get("generation", 1))


async def apply_children(
    kube: Kube, body: dict[str, Any], spec: GenPoolSpec, options: OperatorOptions
) -> list[ChildChange]:
    children = build_children(
        pool_ref(body), spec, image_default=options.worker_image, admin_token=options.admin_token
    )
    changes = []
    for child in children:
        changes.append(await _apply_one(kube, child))
    if spec.prefill is None:
        changes.extend(await _remove_prefill_tier(kube, body))
    changes.extend(await apply_inference_pool(kube, body, spec))
    return changes


async def _remove_prefill_tier(kube: Kube, body: dict[str, Any]) -> list[ChildChange]:
    """``spec.prefill`` gone: delete the prefill StatefulSet this GenPool owns (its pods
    go with it; the GEN pods roll back to the worker's default role)."""
    pool = pool_ref(body)
    name = prefill_statefulset_name(pool.name)
    path = resource_path("apps/v1", "StatefulSet", pool.namespace, name)
    existing = await kube.get(path)
    if existing is None or not is_owned_by(existing, pool):
        return []
    options = {"propagationPolicy": "Background"}
    await with_retries(lambda: kube.request("DELETE", path, body=options), what=f"delete {name}")
    return [ChildChange("StatefulSet", name, "deleted")]


async def _apply_one(kube: Kube, child: dict[str, Any]) -> ChildChange:
    kind, name = child["kind"], child["metadata"]["name"]
    if kind == "Secret":
        # The operator may create and patch Secrets but never read them (RBAC), and
        # the token does not change while it runs: only a creation is news.
        _, created = await with_retries(lambda: kube.apply(child), what=f"apply Secret {name}")
        return ChildChange(kind, name, "created" if created else "unchanged")
    before = await kube.get(object_path(child))
    applied, created = await with_retries(lambda: kube.apply(child), what=f"apply {kind} {name}")
    if created or before is None:
        action = "created"
    elif applied["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]:
        action = "updated"
    else:
        action = "unchanged"
    return ChildChange(kind, name, action)


async def record_spec_status(
    kube: Kube, body: dict[str, Any], spec: GenPoolSpec | None, error: str | None
) -> None:
    """observedGeneration, selector and the Degraded fact after a reconcile (``error``:
    the invalid spec's message; else the workers' failures decide)."""
    meta = body["metadata"]
    generation = meta.get("generation")
    stamp = now_iso()
    pods = PoolFailures(kube, meta["namespace"], meta["name"])
    is_disaggregated = None if spec is None else spec.prefill is not None

    def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
        degraded = degraded_condition(error, pods.failures)  # an invalid spec comes first
        # Before the StatefulSet reports, the replicas in force are the workload's.
        start = WorkloadFacts(desired_replicas(spec, status) if spec else 0)
        workload = WorkloadFacts.from_status(status) or start
        patch = reduce_status(status, workload=workload, facts=[degraded], now_text=stamp,
                              observed_generation=generation)  # fmt: skip
        # An invalid spec leaves the children as they are, so the tiers' records too.
        selector = status_selector(meta["name"], is_disaggregated=is_disaggregated,
                                   recorded=status.get("selector"))  # fmt: skip
        tier = {} if spec is None else spec_patch(status, spec.prefill)
        return {"observedGeneration": generation, "selector": selector, **patch, **tier}

    await update_status(kube, meta["namespace"], meta["name"], mutate,
                        after_read=None if error else pods.refresh)  # fmt: skip


async def mirror_statefulset(kube: Kube, statefulset: dict[str, Any]) -> None:
    """Record the StatefulSet's replica counts as the GenPool's workload facts (the
    prefill tier's: ``status.prefill``)."""
    meta = statefulset["metadata"]
    pool = (meta.get("labels") or {}).get(POOL_LABEL)
    if not pool:
        return
    if is_prefill(statefulset):
        await _mirror_prefill(kube, meta["namespace"], pool, statefulset)
        return
    counts = statefulset.get("status") or {}
    workload = WorkloadFacts(
        desired=int((statefulset.get("spec") or {}).get("replicas") or 0),
        replicas=int(counts.get("replicas") or 0),
        ready=int(counts.get("readyReplicas") or 0),
        updated=int(counts.get("updatedReplicas") or 0),
    )
    stamp = now_iso()

    def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any] | None:
        patch = reduce_status(status, workload=workload, now_text=stamp,
                              observed_generation=fresh["metadata"].get("generation"))  # fmt: skip
        return patch if is_news(status, patch) else None

    await update_status(kube, meta["namespace"], pool, mutate)


async def _mirror_prefill(
    kube: Kube, namespace: str, pool: str, statefulset: dict[str, Any]
) -> None:
    counts = PrefillCounts.from_statefulset(statefulset)

    def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any] | None:
        # A StatefulSet still reporting while its deletion runs must not bring it back.
        has_prefill = (fresh.get("spec") or {}).get("prefill") is not None
        return mirror_patch(status, counts, has_prefill=has_prefill)

    await update_status(kube, namespace, pool, mutate)


async def apply_inference_pool(
    kube: Kube, body: dict[str, Any], spec: GenPoolSpec
) -> list[ChildChange]:
    """The InferencePool child of an enabled ``spec.inferencePool``, and its condition.

    A missing CRD, a refused object or an InferencePool of the same name that someone else
    wrote (left alone) is news for the condition, not a failed reconcile: the workers serve
    without a gateway in front of them. Disabled, the InferencePool this GenPool wrote is
    deleted and the condition dropped.
    """
    pool, picker = pool_ref(body), spec.inference_pool.endpoint_picker_ref
    if not spec.inference_pool.enabled or picker is None:
        return await _remove_inference_pool(kube, body)
    child = build_inference_pool(pool, spec.inference_pool)
    changes: list[ChildChange] = []
    try:
        existing = await kube.get(object_path(child))  # None too when the CRD is not installed
        if existing is not None and not is_owned_by(existing, pool):
            condition = not_owned(pool)
        else:
            changes.append(await _apply_one(kube, child))
            condition = applied(pool, picker)
    except KubeError as exc:
        if exc.status >= 500:  # transient: with_retries gave up, kopf retries the handler
            raise
        condition = crd_not_installed() if exc.status == 404 else rejected(exc.status, exc.message)
    if not condition.status:
        log.warning("%s/%s: no InferencePool: %s", pool.namespace, pool.name, condition.message)
    await _set_inference_pool_condition(kube, body, condition)
    return changes


async def _remove_inference_pool(kube: Kube, body: dict[str, Any]) -> list[ChildChange]:
    pool = pool_ref(body)
    name = inference_pool_name(pool.name)
    path = resource_path(INFERENCE_POOL_API_VERSION, INFERENCE_POOL_KIND, pool.namespace, name)
    removed = []
    try:
        existing = await kube.get(path)  # None too when the CRD is not installed
        if existing is not None and is_owned_by(existing, pool):
            await kube.request("DELETE", path)
            removed.append(ChildChange(INFERENCE_POOL_KIND, name, "deleted"))
    except KubeError as exc:
        if exc.status >= 500:
            raise
        # 403: an operator without the inferencepools rule never wrote one to remove.
        log.debug("%s/%s: InferencePool not checked: %s", pool.namespace, pool.name, exc)
    stale = any(
        c.get("type") == INFERENCE_POOL_CONDITION
        for c in (body.get("status") or {}).get("conditions") or []
    )
    if stale:
        await _set_inference_pool_condition(kube, body, None)
    return removed


async def _set_inference_pool_condition(
    kube: Kube, body: dict[str, Any], condition: Condition | None
) -> None:
    """Record ``condition`` (None: drop InferencePoolReady) when it is news."""
    meta = body["metadata"]
    stamp = now_iso()

    def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any] | None:
        facts = [condition] if condition is not None else []
        base = (
            status if condition is not None else without_condition(status, INFERENCE_POOL_CONDITION)
        )
        patch = reduce_status(base, facts=facts, now_text=stamp,
                              observed_generation=fresh["metadata"].get("generation"))  # fmt: skip
        return patch if is_news(status, patch) else None

    await update_status(kube, meta["namespace"], meta["name"], mutate)
