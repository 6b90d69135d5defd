"""The one registry of kopf handlers. Handlers are thin: they parse, delegate to
``reconcile`` / ``statsloop`` and turn outcomes into Events."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf

from genpool_core.names import API_GROUP, API_PLURAL, API_VERSION, MANAGED_BY, MANAGED_BY_LABEL
from genpool_operator.kube import Kube, load_config
from genpool_operator.reconcile import (
    OperatorOptions,
    apply_children,
    mirror_statefulset,
    record_spec_status,
)
from genpool_operator.scrape import WorkerClient
from genpool_operator.spec import GenPoolSpec
from genpool_operator.statsloop import PoolMemory, RoundResult, run_round

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
    closing: bool = False

    def memory(self, uid: str) -> PoolMemory:
        return self.pools.setdefault(uid, PoolMemory())


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
    token = os.environ.get("GENPOOL_ADMIN_TOKEN") or None
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
        spec = GenPoolSpec.from_body(dict(body.get("spec") or {}))
    except ValueError as exc:
        message = f"invalid spec: {exc}"
        await record_spec_status(runtime.kube, raw, None, message)
        kopf.warn(body, reason="InvalidSpec", message=message)
        raise kopf.PermanentError(message) from None
    changes = await apply_children(runtime.kube, raw, spec, runtime.options)
    await record_spec_status(runtime.kube, raw, spec, None)
    changed = [f"{c.kind}/{c.name} {c.action}" for c in changes if c.action != "unchanged"]
    if changed:
        kopf.info(body, reason="ChildrenApplied", message=", ".join(changed))
    # Live fields (knobs, slack, admission target) reach running pods now, no rollout.
    memory = runtime.memory(body["metadata"]["uid"])
    # Nothing is returned: kopf would store it in status, which belongs to us.
    await run_round(runtime.kube, runtime.workers, raw, memory, now=time.monotonic(), tune=False)


@kopf.on.event("apps", "v1", "statefulsets", labels={MANAGED_BY_LABEL: MANAGED_BY})
async def statefulset_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":
        return
    await mirror_statefulset(memo.runtime.kube, dict(body))


@kopf.daemon(API_GROUP, API_VERSION, API_PLURAL, cancellation_timeout=5.0, initial_delay=1.0)
async def stats_daemon(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: Any, **_: Any
) -> None:
    """Every ``tuning.intervalSeconds`` (re-read each round: the body is live)."""
    runtime: Runtime = memo.runtime
    memory = runtime.memory(body["metadata"]["uid"])
    while not stopped and not runtime.closing:
        interval = _interval(body)
        try:
            result = await run_round(
                runtime.kube, runtime.workers, dict(body), memory, now=time.monotonic()
            )
        except Exception as exc:  # one bad round must not kill the pool's daemon
            if stopped or runtime.closing:
                return
            logger.warning("stats round failed: %s", exc)
            result = None
        if result is not None:
            _post_round_events(body, result)
        await stopped.wait(interval)


def _interval(body: kopf.Body) -> float:
    tuning = (body.get("spec") or {}).get("tuning") or {}
    try:
        return max(1.0, float(tuning.get("intervalSeconds", 30)))
    except (TypeError, ValueError):
        return 30.0


def _post_round_events(body: kopf.Body, result: RoundResult) -> None:
    decision = result.decision
    if decision is not None and decision.changed:
        kopf.info(body, reason="Tuned", message=result.change_text())
    if result.push_errors:
        detail = "; ".join(f"{p}: {e}" for p, e in sorted(result.push_errors.items()))
        kopf.warn(body, reason="ConfigPushFailed", message=detail[:1000])
