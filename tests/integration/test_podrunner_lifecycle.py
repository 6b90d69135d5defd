"""The pod runner's lifecycle: probes and restarts, graceful deletes, controllers'
pods, and a runner that is killed and restarted (real apiserver, real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.conftest import DevCluster, Kubectl
from tests.integration.podrunner_support import (
    HTTP_SERVER,
    POD_IP_ENV,
    gone,
    http_get,
    is_ready,
    pod,
    read,
    wait_phase,
    wait_ready,
)
from tests.polling import wait_for


def test_failing_liveness_probe_restarts_the_container(
    core: client.CoreV1Api, ns: str, kubectl: Kubectl
) -> None:
    live = {"tcpSocket": {"port": 9}, "periodSeconds": 1, "failureThreshold": 2}
    script = "import time; print('run', flush=True); time.sleep(600)"
    manifest = pod(
        "unlive",
        ["python", "-c", script],
        terminationGracePeriodSeconds=2,
        container={"livenessProbe": live},
    )
    core.create_namespaced_pod(ns, manifest)

    def restarted() -> client.V1ContainerStatus | None:
        cs = read(core, ns, "unlive").status.container_statuses
        return cs[0] if cs and cs[0].restart_count >= 1 else None

    cs = wait_for(restarted, "a restart after liveness failures", 60)
    assert cs.last_state.terminated is not None
    assert read(core, ns, "unlive").status.phase == "Running"
    assert "run" in kubectl("logs", "-n", ns, "unlive", "--previous").stdout


def test_delete_runs_prestop_and_honours_grace(
    core: client.CoreV1Api, ns: str, tmp_path: Path
) -> None:
    marker, sigterm = tmp_path / "prestop", tmp_path / "sigterm"
    # Ignores SIGTERM (recording it), so only the grace-period SIGKILL can end it.
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'w').write('term'))\n"
        "print('up', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    write_marker = f"import os; open({str(marker)!r}, 'w').write(os.environ['POD_NAME'])"
    hook = {"exec": {"command": ["python", "-c", write_marker]}}
    pod_name = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    manifest = pod(
        "graceful",
        ["python", "-c", script, str(sigterm)],
        terminationGracePeriodSeconds=4,
        container={"env": [pod_name], "lifecycle": {"preStop": hook}},
    )
    core.create_namespaced_pod(ns, manifest)
    wait_phase(core, ns, "graceful", ("Running",))
    wait_for(  # it prints "up" once its SIGTERM handler is installed
        lambda: "up" in core.read_namespaced_pod_log("graceful", ns),
        "the container to print 'up' (its SIGTERM handler installed)",
        30,
    )
    began = time.monotonic()
    core.delete_namespaced_pod("graceful", ns)
    wait_for(lambda: gone(core, ns, "graceful"), "the pod to be gone", 30)
    took = time.monotonic() - began
    assert marker.read_text() == "graceful"  # preStop ran, with the container's env
    assert sigterm.read_text() == "term"  # then SIGTERM
    assert 3.5 <= took <= 15, took  # SIGKILL only once the 4 s grace period ran out


def test_deployment_gets_two_running_pods_with_distinct_ips(
    core: client.CoreV1Api, kube_api: client.ApiClient, ns: str
) -> None:
    labels = {"app": "web2"}
    ready = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    template = pod("x", HTTP_SERVER, container={"env": [POD_IP_ENV], "readinessProbe": ready})
    template = {"metadata": {"labels": labels}, "spec": template["spec"]}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web2"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": template},
    }
    client.AppsV1Api(kube_api).create_namespaced_deployment(ns, deployment)

    def ready_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(ns, label_selector="app=web2").items
        ready = [p for p in pods if p.status.phase == "Running" and is_ready(p)]
        return ready if len(ready) == 2 else []

    pods = wait_for(ready_pods, "2 ready replicas", 90)
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2
    assert all(http_get(ip) == 200 for ip in ips)  # same port, two loopback addresses


def test_statefulset_pods_are_recreated_after_delete(
    core: client.CoreV1Api, kube_api: client.ApiClient, ns: str
) -> None:
    labels = {"app": "sts"}
    ready = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    template = pod("x", HTTP_SERVER, container={"env": [POD_IP_ENV], "readinessProbe": ready})
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "sts"},
        "spec": {
            "replicas": 2,
            "serviceName": "sts",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
        },
    }
    client.AppsV1Api(kube_api).create_namespaced_stateful_set(ns, sts)
    first = wait_ready(core, ns, "sts-0", 60).metadata.uid
    wait_ready(core, ns, "sts-1", 60)  # OrderedReady: only after sts-0 was Ready
    core.delete_namespaced_pod("sts-0", ns)

    def replaced() -> client.V1Pod | None:
        try:
            p = read(core, ns, "sts-0")
        except ApiException:
            return None
        return p if p.metadata.uid != first and is_ready(p) else None

    assert http_get(wait_for(replaced, "a new, ready sts-0", 60).status.pod_ip) == 200


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_runner_restart_kills_orphans_and_finishes_deletes(
    cluster: DevCluster, core: client.CoreV1Api, ns: str, tmp_path: Path
) -> None:
    """A second runner (own node, no scheduling) is SIGKILLed, then started again."""
    node = f"restart-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, "-m", "genpool_devcluster.podrunner", "--kubeconfig",
            str(cluster.kubeconfig), "--state-dir", str(tmp_path / "runner"),
            "--node-name", node, "--no-scheduler"]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        with open(tmp_path / "runner.log", "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=log)

    def pid_of(name: str) -> int | None:
        p = read(core, ns, name)
        cs = p.status.container_statuses
        if p.status.phase != "Running" or not cs or not cs[0].state.running:
            return None
        return int(cs[0].container_id.removeprefix("process://"))

    runner = start()
    try:
        sleeper = ["python", "-c", "import time; time.sleep(600)"]
        for name in ("keep", "drop"):
            core.create_namespaced_pod(ns, pod(name, sleeper, nodeName=node))
        keep_pid = wait_for(lambda: pid_of("keep"), "keep Running")
        drop_pid = wait_for(lambda: pid_of("drop"), "drop Running")
        runner.kill()
        runner.wait()
        core.delete_namespaced_pod("drop", ns)  # nobody runs its deletion now
        # What is checked is that nothing happens with no runner: an absence, which only a
        # stretch of time can show (there is no event to poll for).
        time.sleep(1.0)
        assert not gone(core, ns, "drop") and _alive(keep_pid) and _alive(drop_pid)
        runner = start()
        wait_for(lambda: gone(core, ns, "drop"), "drop's deletion finished by the new runner", 30)
        new_pid = wait_for(lambda: (p := pid_of("keep")) != keep_pid and p, "keep restarted", 30)
        assert read(core, ns, "keep").status.container_statuses[0].restart_count == 1
        assert _alive(new_pid) and not _alive(keep_pid) and not _alive(drop_pid)
        core.delete_namespaced_pod("keep", ns, grace_period_seconds=0)
        wait_for(lambda: not _alive(new_pid), "keep's process to die with its pod", 15)
    finally:
        runner.terminate()
        runner.wait(timeout=20)
        core.delete_node(node)
