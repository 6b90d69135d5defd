"""A small async Kubernetes API client over httpx: server-side apply, merge patches,
lists, pod logs, and retries on conflicts and transient errors.

kopf talks to the API for its own watches; the operator's writes go through here so
they are async (no thread pool), idempotent (server-side apply with one field manager)
and retried in one place.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from genpool_core.names import (
    API_KIND,
    API_PLURAL,
    GROUP_VERSION,
    INFERENCE_POOL_API_VERSION,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_PLURAL,
    MANAGED_BY,
)

log = logging.getLogger("genpool.operator.kube")
FIELD_MANAGER = MANAGED_BY
RETRYABLE_STATUS = frozenset({409, 429, 500, 502, 503, 504})
T = TypeVar("T")

# The kinds the operator writes, by apiVersion and kind: (API prefix, plural).
_PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("v1", "Pod"): "pods",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    (GROUP_VERSION, API_KIND): API_PLURAL,
    (INFERENCE_POOL_API_VERSION, INFERENCE_POOL_KIND): INFERENCE_POOL_PLURAL,
}


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class KubeConfig:
    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True


def load_config(kubeconfig: str | None = None) -> KubeConfig:
    """``kubeconfig`` when given; else in-cluster credentials when present, else the
    kubeconfig (``$KUBECONFIG``)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        # The kubernetes client ships no type hints for its config loaders.
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    auth = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix(
        "BearerToken"
    )
    token = auth.split(" ", 1)[1] if auth and " " in auth else auth
    return KubeConfig(
        server=cfg.host,
        token=token,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
    )


def resource_path(
    api_version: str, kind: str, namespace: str | None, name: str | None = None, sub: str = ""
) -> str:
    plural = _PLURALS[(api_version, kind)]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    if name:
        path += f"/{name}"
    return path + (f"/{sub}" if sub else "")


def object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


class Kube:
    def __init__(self, config: KubeConfig, *, timeout_s: float = 30.0) -> None:
        verify: Any = config.verify
        if config.verify and config.ca_file:
            verify = ssl.create_default_context(cafile=config.ca_file)
        cert: str | tuple[str, str] | None = config.cert_file or None  # cert and key in one...
        if config.cert_file and config.key_file:
            cert = (config.cert_file, config.key_file)  # ...or the two files
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self._http = httpx.AsyncClient(
            base_url=config.server,
            headers=headers,
            verify=verify,
            cert=cert,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=32),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        text: bool = False,
    ) -> Any:
        response = await self._http.request(
            method,
            path,
            json=body,
            params=params,
            headers={"Content-Type": content_type} if body is not None else None,
        )
        if response.status_code >= 400:
            raise KubeError(response.status_code, _error_message(response))
        return response.text if text else response.json()

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[dict[str, Any]] = (await self.request("GET", path, params=params))["items"]
        return items

    async def apply(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Server-side apply: create or update in one idempotent call.

        Returns the object and whether this call created it (201), which tells the
        caller what changed without a read (the operator may not read Secrets).
        """
        response = await self._http.patch(
            object_path(obj),
            json=obj,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        if response.status_code >= 400:
            raise KubeError(response.status_code, _error_message(response))
        result: dict[str, Any] = response.json()
        return result, response.status_code == 201

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )
        return result

    async def pod_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str:
        path = resource_path("v1", "Pod", namespace, pod, "log")
        params = {"container": container, "tailLines": str(tail_lines)}
        result: str = await self.request("GET", path, params=params, text=True)
        return result


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except ValueError:
        return response.text[:500]


async def with_retries(
    action: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    delay_s: float = 0.2,
    what: str = "API call",
) -> T:
    """Run ``action`` again on conflicts (409) and transient errors, with backoff.

    ``action`` must re-read whatever it depends on, so a retry after a 409 works
    from the object's current resourceVersion.
    """
    for attempt in range(1, attempts + 1):
        try:
            return await action()
        except (KubeError, httpx.TransportError) as exc:
            status = exc.status if isinstance(exc, KubeError) else 0
            retryable = status in RETRYABLE_STATUS or isinstance(exc, httpx.TransportError)
            if not retryable or attempt == attempts:
                raise
            log.info("%s failed (%s), retry %d/%d", what, exc, attempt, attempts - 1)
            await asyncio.sleep(delay_s * 2 ** (attempt - 1))
    raise AssertionError("unreachable")
