"""The one registry of kopf handlers. Handlers are thin: they parse, delegate to
``reconcile`` / ``statsloop`` and turn outcomes into Events.

Each GenPool has one stats daemon; it alone runs the pool's rounds. The reconcile
handler wakes it after a spec change, for a round that pushes the live fields."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf

from genpool_core.names import (
    API_GROUP,
    API_PLURAL,
    API_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POOL_LABEL,
)
from genpool_core.worker_env import ADMIN_TOKEN_ENV
from genpool_operator import metrics
from genpool_operator.kube import Kube, load_config
from genpool_operator.pool_health import record_worker_health
from genpool_operator.reconcile import (
    OperatorOptions,
    apply_children,
    mirror_statefulset,
    record_spec_status,
)
from genpool_operator.round_plan import round_events, round_interval
from genpool_operator.scaling_plan import spec_in_force
from genpool_operator.scrape import WorkerClient
from genpool_operator.spec import GenPoolSpec, GenPoolSpecError
from genpool_operator.spec_check import checked_spec, invalid_spec_message
from genpool_operator.statsloop import PoolMemory, RoundReport, run_round
from genpool_operator.status import read_status
from genpool_operator.tiers import role_of

DEFAULT_WORKER_IMAGE = "genpool/worker:0.1.0"
log = logging.getLogger("genpool.operator")


@dataclass
class Runtime:
    """Everything the handlers share, created once in the startup handler."""

    kube: Kube
    workers: WorkerClient
    http: httpx.AsyncClient
    options: OperatorOptions
    pools: dict[str, PoolMemory] = field(default_factory=dict)
    uids: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) -> uid
    closing: bool = False

    def memory(self, uid: str) -> PoolMemory:
        return self.pools.setdefault(uid, PoolMemory())

    def wake(self, namespace: str, name: str) -> None:
        """Wake the pool's daemon for a round without tuning (if it runs)."""
        uid = self.uids.get((namespace, name))
        if uid is not None:
            self.memory(uid).wake.set()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base live in annotations: the user's status stays ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.networking.request_timeout = 30
    settings.batching.error_delays = [1, 2, 5, 10, 30]
    # Concurrency is bounded by WorkerClient's semaphore (64); httpx's default pool
    # (100 connections) covers it.
    http = httpx.AsyncClient()
    token = os.environ.get(ADMIN_TOKEN_ENV) or None
    memo.runtime = Runtime(
        kube=Kube(load_config()),
        workers=WorkerClient(http, token),
        http=http,
        options=OperatorOptions(
            worker_image=os.environ.get("GENPOOL_WORKER_IMAGE", DEFAULT_WORKER_IMAGE),
            admin_token=token,
        ),
    )


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    runtime.closing = True  # daemons may still be winding down: they stop, not fail
    await runtime.http.aclose()
    await runtime.kube.aclose()


@kopf.on.resume(API_GROUP, API_VERSION, API_PLURAL)
@kopf.on.create(API_GROUP, API_VERSION, API_PLURAL)
@kopf.on.update(API_GROUP, API_VERSION, API_PLURAL)
async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    raw = dict(body)
    try:
        spec = checked_spec(dict(body.get("spec") or {}))
    except GenPoolSpecError as exc:
        message = invalid_spec_message(exc)
        await record_spec_status(runtime.kube, raw, None, message)
        kopf.warn(body, reason="InvalidSpec", message=message)
        raise kopf.PermanentError(message) from None
    # With autoscaling the replicas are the scaler's (status.desiredReplicas, read afresh:
    # the event may predate the last round's write): never reset to spec.replicas.
    meta = body["metadata"]
    spec = spec_in_force(spec, await read_status(runtime.kube, meta["namespace"], meta["name"]))
    changes = await apply_children(runtime.kube, raw, spec, runtime.options)
    await record_spec_status(runtime.kube, raw, spec, None)
    changed = [f"{c.kind}/{c.name} {c.action}" for c in changes if c.action != "unchanged"]
    if changed:
        kopf.info(body, reason="ChildrenApplied", message=", ".join(changed))
    # Live fields (knobs, slack, admission target) reach running pods now, no rollout:
    # the pool's daemon runs a round without tuning as soon as it is woken.
    runtime.memory(body["metadata"]["uid"]).wake.set()
    # Nothing is returned: kopf would store it in status, which belongs to us.


@kopf.on.event("apps", "v1", "statefulsets", labels={MANAGED_BY_LABEL: MANAGED_BY})
async def statefulset_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":
        return
    await mirror_statefulset(memo.runtime.kube, dict(body))


@kopf.on.event("", "v1", "pods", labels={MANAGED_BY_LABEL: MANAGED_BY, POOL_LABEL: kopf.PRESENT})
async def worker_pod_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A worker's status changed (or it is gone): Degraded says whether the pool's
    workers crash-loop or cannot start, and why (their termination messages). In a P/D
    pool (its pods carry a role) a change wakes the pool's daemon: a prefill pod that came
    or went, or a decode pod that just got ready, is told the endpoints now, not a tuning
    interval later."""
    meta = body["metadata"]
    runtime: Runtime = memo.runtime
    pool = meta["labels"][POOL_LABEL]
    await record_worker_health(runtime.kube, meta["namespace"], pool)
    if role_of(body) is not None:
        runtime.wake(meta["namespace"], pool)


@kopf.daemon(API_GROUP, API_VERSION, API_PLURAL, cancellation_timeout=5.0, initial_delay=1.0)
async def stats_daemon(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: Any, **_: Any
) -> None:
    """A tuning round every ``tuning.intervalSeconds`` (re-read each round: the body is
    live), and a round without tuning whenever the reconcile handler wakes it."""
    runtime: Runtime = memo.runtime
    meta = body["metadata"]
    memory = runtime.memory(meta["uid"])
    runtime.uids[(meta["namespace"], meta["name"])] = meta["uid"]
    due = time.monotonic()  # when the next tuning round is due
    try:
        while not stopped and not runtime.closing:
            is_tuning = time.monotonic() >= due
            memory.wake.clear()  # this round covers every wake so far
            spec = _valid_spec(body)
            report = None
            if spec is not None:
                try:
                    report = await run_round(
                        runtime.kube, runtime.workers, dict(body), spec, memory,
                        tune=is_tuning,
                    )  # fmt: skip
                except Exception as exc:  # one bad round must not kill the pool's daemon
                    if stopped or runtime.closing:
                        return
                    logger.warning("stats round failed: %s", exc)
            if report is not None:
                _post_round_events(body, report)
            if is_tuning:
                due = time.monotonic() + round_interval(spec)
            await _sleep_until_woken(stopped, memory.wake, due - time.monotonic())
    finally:
        if stopped.reason and kopf.DaemonStoppingReason.RESOURCE_DELETED in stopped.reason:
            metrics.forget_pool(meta["namespace"], meta["name"])
            runtime.uids.pop((meta["namespace"], meta["name"]), None)


def _valid_spec(body: kopf.Body) -> GenPoolSpec | None:
    """The spec, or None when invalid (the reconcile handler reports that)."""
    try:
        return checked_spec(dict(body.get("spec") or {}))
    except GenPoolSpecError:
        return None


async def _sleep_until_woken(
    stopped: kopf.DaemonStopped, wake: asyncio.Event, timeout: float
) -> None:
    """Sleep ``timeout`` seconds, or less if the daemon is stopped or woken."""
    if timeout <= 0 or wake.is_set():
        return
    waits = [asyncio.ensure_future(stopped.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


def _post_round_events(body: kopf.Body, report: RoundReport) -> None:
    prefill = report.prefill.events() if report.prefill else []
    for event in [*round_events(report.plan, report.push), *prefill]:
        post = kopf.info if event.type == "Normal" else kopf.warn
        post(body, reason=event.reason, message=event.message)
