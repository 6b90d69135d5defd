"""What a real node adds, on the kubelet with the images built from the shipped Dockerfiles:
the chart's security context enforced with the worker still serving, readiness and
liveness probes as the kubelet runs them, an OOM kill, a crash loop's back-off and a pod no
node can take all reaching the GenPool's status. Each of these was out of reach under the
pod runner (it runs every pod it is given, without limits)."""

from __future__ import annotations

from typing import Any

import openai
from kubernetes import client

from genpool_core.names import WORKER_PORT
from tests.conftest import Kubectl
from tests.integration.operator_harness import get_pool
from tests.node.kubelet_pools import MISSING_MODEL, NodePools, ready_pod
from tests.polling import wait_for

CONTAINER = "worker"


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


def _wait_degraded(
    api: client.ApiClient, namespace: str, name: str, why: str, timeout: float
) -> dict[str, Any]:
    """The pool's Degraded condition, once it is True."""
    found: dict[str, Any] = wait_for(
        lambda: (d := _degraded(api, namespace, name)).get("status") == "True" and d,
        f"Degraded=True from {why}",
        timeout,
    )
    return found


def _reasons(api: client.ApiClient, namespace: str, pod: str) -> set[str]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod}"
    )
    return {e.reason for e in events.items}


def test_the_worker_serves_under_the_charts_security_context(
    kube_api: client.ApiClient, kubectl: Kubectl, pools: NodePools
) -> None:
    namespace = pools.namespaces["secure"]
    pod = ready_pod(kube_api, namespace, "secure")
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


def test_probes_as_the_kubelet_runs_them(kube_api: client.ApiClient, pools: NodePools) -> None:
    namespace = pools.namespaces["probed"]
    pod = pools.hung.result(timeout=300)  # stopped, and NotReady by its readiness probe
    # Liveness: six failed checks ten seconds apart, then the kubelet restarts it.
    status = wait_for(
        lambda: (s := _worker_status(kube_api, namespace)) and s.restart_count >= 1 and s,
        "the liveness probe restarts the worker",
        timeout=150,
    )
    assert status.last_state.terminated is not None
    again = ready_pod(kube_api, namespace, "probed")
    assert again.metadata.uid == pod.metadata.uid  # the same pod, its container restarted
    assert {"Unhealthy", "Killing"} <= _reasons(kube_api, namespace, pod.metadata.name)


def test_a_worker_over_its_memory_limit_is_oom_killed_and_the_pool_says_so(
    kube_api: client.ApiClient, pools: NodePools
) -> None:
    namespace = pools.namespaces["small"]
    degraded = _wait_degraded(kube_api, namespace, "small", "the OOM-killed worker", timeout=180)
    assert degraded["reason"] == "WorkerCrashLoop"
    assert "OOMKilled: over its memory limit" in degraded["message"], degraded
    status = _worker_status(kube_api, namespace)
    assert status is not None and status.last_state.terminated.reason == "OOMKilled"


def test_a_crash_looping_worker_backs_off_and_the_pool_says_why(
    kube_api: client.ApiClient, pools: NodePools
) -> None:
    namespace = pools.namespaces["broken"]
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
    assert len(_pods(kube_api, namespace)) == 1
    # The back-off is read from the pod's status, not from a BackOff Event: the kubelet's
    # recorder drops a pod's Events past a burst of 25 (client-go's spam filter, one
    # bucket per pod), and on this node every sync of the pod also records
    # MissingClusterDNS, so on a slow hour the burst is spent before the back-off starts.
    degraded = _wait_degraded(kube_api, namespace, "broken", "the crash-looping worker", timeout=60)
    assert degraded["message"] == (
        f"pod broken-worker-0: GGUFLoadError: GGUF file not found: {MISSING_MODEL}"
    )


def test_a_worker_no_node_can_take_degrades_the_pool_with_the_schedulers_word(
    kube_api: client.ApiClient, pools: NodePools
) -> None:
    namespace = pools.namespaces["unplaceable"]
    degraded = _wait_degraded(
        kube_api, namespace, "unplaceable", "the unschedulable worker", timeout=60
    )
    assert degraded["reason"] == "WorkerUnschedulable"
    assert degraded["message"].startswith("pod unplaceable-worker-0: Unschedulable: 0/1 nodes")
    assert "Insufficient cpu" in degraded["message"]
