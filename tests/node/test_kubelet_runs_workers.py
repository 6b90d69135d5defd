"""What a real node adds, on the kubelet with the images built from the shipped Dockerfiles:
the chart's security context enforced with the worker still serving, readiness and
liveness probes as the kubelet runs them, an OOM kill and a crash loop's back-off both
reaching the GenPool's status. Each of these was out of reach under the pod runner."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from kubernetes import client

from genpool_core.names import WORKER_PORT
from tests.conftest import Kubectl
from tests.integration.operator_harness import (
    create_pool,
    genpool,
    get_pool,
    ready_pods,
    synthetic_spec,
)
from tests.polling import wait_for

CONTAINER = "worker"
MISSING_MODEL = "no-such-model.gguf"


def _pods(api: client.ApiClient, namespace: str) -> list[client.V1Pod]:
    return list(client.CoreV1Api(api).list_namespaced_pod(namespace).items)


def _worker_status(api: client.ApiClient, namespace: str) -> client.V1ContainerStatus | None:
    for pod in _pods(api, namespace):
        for status in pod.status.container_statuses or []:
            if status.name == CONTAINER:
                return status
    return None


def _degraded(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    conditions = (get_pool(api, namespace, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Degraded"), {})


def _ready_pod(api: client.ApiClient, namespace: str, pool: str) -> client.V1Pod:
    pods: list[client.V1Pod] = wait_for(
        lambda: ready_pods(api, namespace, pool), f"{pool}: a ready worker pod", timeout=240
    )
    return pods[0]


def _reasons(api: client.ApiClient, namespace: str, pod: str) -> set[str]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod}"
    )
    return {e.reason for e in events.items}


# Each test's pool, all created at once by `pools`: their starts, back-offs and probe
# periods overlap instead of adding up. SmolLM2's fp32 weights alone are ~540 MB: loading
# them breaks a 300Mi limit.
POOLS: dict[str, dict[str, Any]] = {
    "secure": synthetic_spec(),
    "probed": synthetic_spec(),
    "small": synthetic_spec(
        model="smollm2-135m",
        resources={"limits": {"memory": "300Mi"}},
        engine={"maxBatchSize": 8, "kvCacheMemory": "16Mi"},
    ),
    "broken": synthetic_spec(model=MISSING_MODEL),
}


@pytest.fixture(scope="module")
def pools(kube_api: client.ApiClient, chart: str) -> Iterator[dict[str, str]]:
    """Pool name -> its own namespace, each pool created there; deleted afterwards."""
    core = client.CoreV1Api(kube_api)
    namespaces = {name: f"node-{name}-{uuid.uuid4().hex[:6]}" for name in POOLS}
    for name, ns in namespaces.items():
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        create_pool(kube_api, ns, genpool(name, POOLS[name]))
    yield namespaces
    for ns in namespaces.values():
        core.delete_namespace(ns)


def test_the_worker_serves_under_the_charts_security_context(
    kube_api: client.ApiClient, kubectl: Kubectl, pools: dict[str, str]
) -> None:
    namespace = pools["secure"]
    pod = _ready_pod(kube_api, namespace, "secure")
    script = "id -u; id -g; grep CapEff /proc/1/status; touch /written 2>&1; echo done"
    out = kubectl("exec", "-n", namespace, pod.metadata.name, "-c", CONTAINER, "--",
                  "sh", "-c", script).stdout.splitlines()  # fmt: skip
    assert out[:2] == ["10001", "10001"], out  # the image's user; runAsNonRoot verified it
    assert out[2].split() == ["CapEff:", "0000000000000000"], out  # capabilities: drop ALL
    assert "Read-only file system" in out[3], out  # readOnlyRootFilesystem
    sdk = openai.OpenAI(
        base_url=f"http://{pod.status.pod_ip}:{WORKER_PORT}/v1", api_key="unused", max_retries=0
    )
    model = sdk.models.list().data[0].id
    reply = sdk.completions.create(model=model, prompt="Hello", max_tokens=4)
    assert reply.choices[0].text and reply.usage and reply.usage.completion_tokens == 4


def _worker_pid(pod_uid: str) -> int:
    """The worker process of that pod, seen from this host: its cgroup names the pod."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroup = (proc / "cgroup").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"pod{pod_uid}" in cgroup and any(a.endswith(b"genpool-worker") for a in cmdline):
            return int(proc.name)
    raise AssertionError(f"no genpool-worker process in pod {pod_uid}")


def test_probes_as_the_kubelet_runs_them(kube_api: client.ApiClient, pools: dict[str, str]) -> None:
    namespace = pools["probed"]
    pod = _ready_pod(kube_api, namespace, "probed")
    # A hung worker: stopped, it answers no probe.
    os.kill(_worker_pid(pod.metadata.uid), signal.SIGSTOP)
    wait_for(lambda: not ready_pods(kube_api, namespace, "probed"), "readiness fails", 30)
    # Liveness: six failed checks ten seconds apart, then the kubelet restarts it.
    status = wait_for(
        lambda: (s := _worker_status(kube_api, namespace)) and s.restart_count >= 1 and s,
        "the liveness probe restarts the worker",
        timeout=150,
    )
    assert status.last_state.terminated is not None
    again = _ready_pod(kube_api, namespace, "probed")
    assert again.metadata.uid == pod.metadata.uid  # the same pod, its container restarted
    assert {"Unhealthy", "Killing"} <= _reasons(kube_api, namespace, pod.metadata.name)


def test_a_worker_over_its_memory_limit_is_oom_killed_and_the_pool_says_so(
    kube_api: client.ApiClient, pools: dict[str, str]
) -> None:
    namespace = pools["small"]
    degraded = wait_for(
        lambda: (d := _degraded(kube_api, namespace, "small")).get("status") == "True" and d,
        "Degraded=True from the OOM-killed worker",
        timeout=180,
    )
    assert degraded["reason"] == "WorkerCrashLoop"
    assert "OOMKilled: over its memory limit" in degraded["message"], degraded
    status = _worker_status(kube_api, namespace)
    assert status is not None and status.last_state.terminated.reason == "OOMKilled"


def test_a_crash_looping_worker_backs_off_and_the_pool_says_why(
    kube_api: client.ApiClient, pools: dict[str, str]
) -> None:
    namespace = pools["broken"]
    status = wait_for(
        lambda: (
            (s := _worker_status(kube_api, namespace))
            and s.restart_count >= 2
            and s.state.waiting
            and s.state.waiting.reason == "CrashLoopBackOff"
            and s
        ),
        "the kubelet backs off between restarts",
        timeout=180,
    )
    assert status.last_state.terminated.exit_code != 0
    (pod,) = _pods(kube_api, namespace)
    assert "BackOff" in _reasons(kube_api, namespace, pod.metadata.name)
    degraded = wait_for(
        lambda: (d := _degraded(kube_api, namespace, "broken")).get("status") == "True" and d,
        "Degraded=True",
        timeout=60,
    )
    assert degraded["message"] == (
        f"pod broken-worker-0: GGUFLoadError: GGUF file not found: {MISSING_MODEL}"
    )
