"""Talking to worker pods: recent stat lines (HTTP or pod logs), ``GET``/``PUT /config``,
and a decode worker's prefill endpoints (``GET``/``PUT /prefillers``).

Every call has a timeout and the operator-wide semaphore bounds how many run at once,
so one slow or dead pod delays nobody else's scrape. Failures come back as values
(``None`` / a reason), never as exceptions, because a pod that cannot be read is an
ordinary event here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from genpool_core.live import LiveUpdate
from genpool_core.names import GENERATION_FIELD, WORKER_PORT
from genpool_core.statline import StatLine, parse_statlines
from genpool_operator.kube import Kube, KubeError
from genpool_operator.prefill_plan import parse_endpoints

log = logging.getLogger("genpool.operator.scrape")
LOG_TAIL_LINES = 200
T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class PodTarget:
    name: str
    ip: str
    uid: str


def ready_targets(pods: Sequence[dict[str, Any]]) -> list[PodTarget]:
    """Pods that are Running, Ready, have an IP and are not being deleted."""
    targets = []
    for pod in pods:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        if meta.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        if conditions.get("Ready") != "True" or not status.get("podIP"):
            continue
        targets.append(PodTarget(meta["name"], status["podIP"], meta.get("uid", "")))
    return sorted(targets, key=lambda t: t.name)


class WorkerClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        admin_token: str | None,
        *,
        port: int = WORKER_PORT,
        timeout_s: float = 3.0,
        concurrency: int = 64,
    ) -> None:
        self._http = http
        self._token = admin_token
        self._port = port
        self._timeout = httpx.Timeout(timeout_s)
        self._limit = asyncio.Semaphore(concurrency)

    def _url(self, target: PodTarget, path: str) -> str:
        return f"http://{target.ip}:{self._port}{path}"

    def _admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def gather(
        self, call: Callable[[PodTarget], Awaitable[T]], targets: Sequence[PodTarget]
    ) -> list[T]:
        async def bounded(target: PodTarget) -> T:
            async with self._limit:
                return await call(target)

        return list(await asyncio.gather(*(bounded(t) for t in targets)))

    async def statlines(self, target: PodTarget) -> list[StatLine] | None:
        """The pod's recent periodic stat lines, oldest first (``None``: unreadable)."""
        try:
            response = await self._http.get(self._url(target, "/statlines"), timeout=self._timeout)
        except httpx.HTTPError as exc:
            log.info("stat lines from %s: %s", target.name, exc)
            return None
        if response.status_code != 200:
            log.info("stat lines from %s: HTTP %d", target.name, response.status_code)
            return None
        return parse_statlines(response.text)

    async def config(self, target: PodTarget) -> dict[str, Any] | None:
        try:
            response = await self._http.get(self._url(target, "/config"), timeout=self._timeout)
            body = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            log.info("config of %s: %s", target.name, exc)
            return None
        return body if isinstance(body, dict) else None

    async def put_config(self, target: PodTarget, update: LiveUpdate) -> str | None:
        """Push live knobs; ``None`` on success, else why it failed."""
        return await self._put(target, "/config", update.to_json())

    async def prefillers(self, target: PodTarget) -> list[str] | None:
        """The prefill endpoints a decode worker round-robins over (``None``: unreadable)."""
        try:
            response = await self._http.get(
                self._url(target, "/prefillers"),
                headers=self._admin_headers(),
                timeout=self._timeout,
            )
            body = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            log.info("prefillers of %s: %s", target.name, exc)
            return None
        return parse_endpoints(body)

    async def put_prefillers(self, target: PodTarget, endpoints: Sequence[str]) -> str | None:
        """Tell a decode worker the prefill endpoints; ``None`` on success, else why not."""
        return await self._put(target, "/prefillers", {"endpoints": list(endpoints)})

    async def _put(self, target: PodTarget, path: str, body: dict[str, Any]) -> str | None:
        try:
            response = await self._http.put(
                self._url(target, path),
                json=body,
                headers=self._admin_headers(),
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.is_success:
            return None
        return f"HTTP {response.status_code}: {response.text[:200]}"


async def statlines_from_log(kube: Kube, namespace: str, pod: str) -> list[StatLine] | None:
    """The stat lines in the worker container's log tail, oldest first (``statsSource:
    Log``; ``None``: unreadable)."""
    try:
        text = await kube.pod_log(namespace, pod, "worker", LOG_TAIL_LINES)
    except (KubeError, httpx.HTTPError) as exc:
        log.info("log of %s/%s: %s", namespace, pod, exc)
        return None
    return parse_statlines(text)


def in_sync(config: dict[str, Any] | None, update: LiveUpdate) -> bool:
    """A pod is in sync when it reports our generation and every live value we set."""
    if config is None or config.get(GENERATION_FIELD) != update.generation:
        return False
    return all(_same(config.get(key), value) for key, value in update.values().items())


def _same(reported: object, wanted: object) -> bool:
    if isinstance(reported, int | float) and isinstance(wanted, int | float):
        return abs(float(reported) - float(wanted)) < 1e-9
    return reported == wanted
