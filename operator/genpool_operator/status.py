"""Writing a GenPool's status safely from its several writers (the reconcile handler,
the StatefulSet mirror, the InferencePool child, the pod watch, the stats round).

Each write re-reads the object and sends a merge patch carrying its resourceVersion:
a concurrent write makes the apiserver answer 409 and ``with_retries`` runs the whole
read-compute-write again, so no writer silently drops another's facts
(``pool_status.reduce_status`` derives the rest from them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from genpool_core.names import API_KIND, GROUP_VERSION
from genpool_operator.kube import Kube, KubeError, resource_path, with_retries

StatusMutation = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None]


def now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pool_path(namespace: str, name: str, sub: str = "") -> str:
    return resource_path(GROUP_VERSION, API_KIND, namespace, name, sub)


async def read_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The GenPool's status as stored now ({} when gone): an event's copy may be older
    than the last stats round's write."""
    body = await kube.get(pool_path(namespace, name))
    return dict((body or {}).get("status") or {})


async def update_status(
    kube: Kube,
    namespace: str,
    name: str,
    mutate: StatusMutation,
    *,
    attempts: int = 6,
    after_read: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any] | None:
    """Apply ``mutate(status, body) -> status patch`` with optimistic concurrency.

    ``after_read`` is awaited after each read of the GenPool, before ``mutate``: facts it
    gathers (the pods' failures) are then never older than the status they replace. A
    writer that gathered them first could overwrite a newer finding written in between
    with its stale one, and keep it: nothing would write again until a pod changed.

    Returns the updated object, or ``None`` when the GenPool is gone or ``mutate``
    had nothing to change.
    """

    async def once() -> dict[str, Any] | None:
        body = await kube.get(pool_path(namespace, name))
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        if after_read is not None:
            await after_read()
        patch = mutate(dict(body.get("status") or {}), body)
        if not patch:
            return body
        version = body["metadata"]["resourceVersion"]
        return await kube.merge_patch(
            pool_path(namespace, name, "status"),
            {"metadata": {"resourceVersion": version}, "status": patch},
        )

    try:
        return await with_retries(once, attempts=attempts, what=f"status of {namespace}/{name}")
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise
