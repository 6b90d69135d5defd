"""One stats round for one pool, the I/O half: scrape, push, write status.

What a round decides is :mod:`genpool_operator.round_plan` (pure). This module only
gathers its inputs (the pool's ready pods and their stat lines), pushes the planned
live config to the pods that are not yet in sync, and writes the planned status. In a
P/D pool it also tells each GEN (decode) worker where the ready prefill pods are
(``PUT /prefillers``, :mod:`genpool_operator.prefill_plan`) when it reports another set.
The kopf daemon in ``handlers`` runs a tuning round every ``tuning.intervalSeconds``,
and a round without tuning when the reconcile handler wakes it after a spec change
(so live fields reach the pods without waiting for the next interval).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from genpool_core.live import LiveUpdate
from genpool_core.names import pool_label_selector
from genpool_core.statline import StatLine
from genpool_operator import metrics
from genpool_operator.builders import statefulset_name
from genpool_operator.kube import Kube, resource_path
from genpool_operator.prefill_plan import PrefillRound, needs_push, prefill_endpoints
from genpool_operator.round_plan import PushOutcome, RoundPlan, plan_round, status_patch
from genpool_operator.scaling_plan import is_autoscaled
from genpool_operator.scrape import (
    PodTarget,
    WorkerClient,
    in_sync,
    ready_targets,
    statlines_from_log,
)
from genpool_operator.spec import GenPoolSpec
from genpool_operator.status import now_iso, pool_path, update_status
from genpool_operator.tiers import split_tiers

log = logging.getLogger("genpool.operator.stats")


@dataclass
class PoolMemory:
    """What the operator keeps about one pool between rounds, in memory only (the
    controller's state is in the GenPool's status)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one round at a time
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set: run a round now


@dataclass(frozen=True, slots=True)
class RoundReport:
    plan: RoundPlan
    push: PushOutcome
    prefill: PrefillRound | None = None  # a P/D pool's endpoint push


async def read_lines(
    workers: WorkerClient, kube: Kube, spec: GenPoolSpec, namespace: str, targets: list[PodTarget]
) -> dict[str, Sequence[StatLine]]:
    """Each readable pod's recent stat lines, oldest first."""
    if spec.tuning.stats_source == "Log":

        async def from_log(target: PodTarget) -> list[StatLine] | None:
            return await statlines_from_log(kube, namespace, target.name)

        lines = await workers.gather(from_log, targets)
    else:
        lines = await workers.gather(workers.statlines, targets)
    return {t.name: found for t, found in zip(targets, lines, strict=True) if found}


async def push_live(
    workers: WorkerClient, targets: list[PodTarget], update: LiveUpdate
) -> tuple[int, dict[str, str]]:
    """Push to every pod not yet in sync; returns (pods in sync, errors by pod)."""
    configs = await workers.gather(workers.config, targets)
    stale = [t for t, c in zip(targets, configs, strict=True) if not in_sync(c, update)]
    results = await workers.gather(lambda t: workers.put_config(t, update), stale)
    errors = {t.name: err for t, err in zip(stale, results, strict=True) if err is not None}
    return len(targets) - len(errors), errors


async def push_prefillers(
    workers: WorkerClient, targets: list[PodTarget], endpoints: Sequence[str]
) -> PushOutcome:
    """``PUT /prefillers`` to every decode worker that reports another set of endpoints."""
    reported = await workers.gather(workers.prefillers, targets)
    stale = [t for t, found in zip(targets, reported, strict=True) if needs_push(found, endpoints)]
    results = await workers.gather(lambda t: workers.put_prefillers(t, endpoints), stale)
    errors = {t.name: err for t, err in zip(stale, results, strict=True) if err is not None}
    return PushOutcome(len(targets) - len(errors), len(targets), errors)


async def list_tiers(
    kube: Kube, namespace: str, name: str
) -> tuple[list[PodTarget], list[PodTarget]]:
    """The pool's ready pods as (GEN targets, prefill targets): one list call for both."""
    pods = await kube.list(
        resource_path("v1", "Pod", namespace), label_selector=pool_label_selector(name)
    )
    gen, prefill = split_tiers(pods)
    return ready_targets(gen), ready_targets(prefill)


async def prefill_round(
    workers: WorkerClient, spec: GenPoolSpec, targets: list[PodTarget], prefill: list[PodTarget]
) -> PrefillRound | None:
    """Tell the decode workers (``targets``) the ready prefill pods; None without P/D."""
    if spec.prefill is None:
        return None
    endpoints = prefill_endpoints(t.ip for t in prefill)
    return PrefillRound(endpoints, await push_prefillers(workers, targets, endpoints))


async def scale_statefulset(kube: Kube, namespace: str, pool: str, replicas: int) -> bool:
    """Set the pool's StatefulSet to ``replicas`` through its scale subresource (True:
    it changed). Scale-down removes the highest ordinals; each pod's preStop drains it."""
    path = resource_path("apps/v1", "StatefulSet", namespace, statefulset_name(pool), "scale")
    scale = await kube.get(path)
    if scale is None or (scale.get("spec") or {}).get("replicas") == replicas:
        return False
    await kube.merge_patch(path, {"spec": {"replicas": replicas}})
    return True


async def run_round(
    kube: Kube,
    workers: WorkerClient,
    body: dict[str, Any],
    spec: GenPoolSpec,
    memory: PoolMemory,
    *,
    tune: bool = True,
) -> RoundReport:
    """Scrape, plan, push and record one round for the pool ``body`` (valid ``spec``);
    with autoscaling, then set the StatefulSet to the desired replicas."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    async with memory.lock:
        started = time.perf_counter()
        targets, prefill_targets = await list_tiers(kube, namespace, name)
        lines = await read_lines(workers, kube, spec, namespace, targets)
        # Read afresh: the controller's state lives in status and the last round wrote it.
        fresh = await kube.get(pool_path(namespace, name)) or body
        status = dict(fresh.get("status") or {})
        # Wall clock: the state is persisted, so it must survive an operator restart.
        now = time.time()
        plan = plan_round(spec, status, lines, now=now, num_ready=len(targets), is_deciding=tune)
        num_in_sync, errors = await push_live(workers, targets, plan.update)
        push = PushOutcome(num_in_sync, len(targets), errors)
        prefill = await prefill_round(workers, spec, targets, prefill_targets)
        stamp = now_iso()

        def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
            generation = fresh["metadata"].get("generation")
            patch = status_patch(
                spec, plan, push, status, observed_generation=generation, now_text=stamp
            )
            # Merged into status.prefill beside the mirror's counts, while the tier exists.
            if prefill is not None and (fresh.get("spec") or {}).get("prefill") is not None:
                patch["prefill"] = prefill.to_status()
            return patch

        await update_status(kube, namespace, name, mutate)
        if plan.decision.scaling is not None and is_autoscaled(spec):
            # The scaler's count is within the spec's bounds (it clamps at once).
            await scale_statefulset(kube, namespace, name, plan.decision.desired)
        metrics.record_round(
            namespace,
            name,
            plan,
            is_autoscaling=spec.autoscaling.enabled,
            num_scrape_errors=len(targets) - len(lines),
            seconds=time.perf_counter() - started,
        )
    return RoundReport(plan, push, prefill)
