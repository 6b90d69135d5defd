"""Helpers for the pod runner's tests: pod manifests, reads and waits."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.polling import wait_for

NODE = "genpool-dev"
IMAGE = "genpool/not-pulled:dev"
HTTP_SERVER = ["python", "-m", "http.server", "--bind", "$(POD_IP)", "8080"]
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": IMAGE, "command": command}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [container], **spec},
    }


def read(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod:
    return core.read_namespaced_pod(name, ns)


def is_ready(p: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])


def wait_phase(
    core: client.CoreV1Api, ns: str, name: str, phases: tuple[str, ...], t: float = 60
) -> client.V1Pod:
    return wait_for(
        lambda: (p := read(core, ns, name)).status.phase in phases and p, f"{name} in {phases}", t
    )


def wait_ready(core: client.CoreV1Api, ns: str, name: str, t: float = 60) -> client.V1Pod:
    def ready() -> client.V1Pod | None:
        p = read(core, ns, name)  # a 404 (a controller has yet to create it) is "not yet"
        return p if is_ready(p) else None

    return wait_for(ready, f"{name} Ready", t)


def gone(core: client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        read(core, ns, name)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def http_get(ip: str, port: int = 8080) -> int:
    with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=5) as resp:
        return int(resp.status)


def last_json_line(text: str) -> dict[str, Any]:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
