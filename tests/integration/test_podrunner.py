"""The pod runner plays scheduler + kubelet: real pods through the real apiserver.

Every test here needs the `cluster` fixture, which fails (never skips) when no control plane can
be started. Containers run `python` from this project's venv (the runner puts its bin dir first
on PATH); the images named are never pulled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from genpool_devcluster.podrunner.env import expand
from tests.conftest import DevCluster, Kubectl
from tests.polling import wait_for

NODE = "genpool-dev"
IMAGE = "genpool/not-pulled:dev"
HTTP_SERVER = ["python", "-m", "http.server", "--bind", "$(POD_IP)", "8080"]
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


@pytest.fixture
def core(kube_api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api)


@pytest.fixture
def ns(core: client.CoreV1Api, namespace: str) -> str:
    """The test namespace once its `default` ServiceAccount exists (admission needs it)."""

    def has_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", namespace)
            return True
        except ApiException as err:
            if err.status == 404:
                return False
            raise

    wait_for(has_sa, "the default ServiceAccount")
    return namespace


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


def wait_phase(core: client.CoreV1Api, ns: str, name: str, phases: tuple[str, ...], t: float = 60):
    return wait_for(
        lambda: (p := read(core, ns, name)).status.phase in phases and p, f"{name} in {phases}", t
    )


def wait_ready(core: client.CoreV1Api, ns: str, name: str, t: float = 60) -> client.V1Pod:
    def ready() -> client.V1Pod | None:
        try:
            p = read(core, ns, name)
        except ApiException as err:
            if err.status == 404:  # a controller has yet to create it
                return None
            raise
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


# ---- pure rules (no cluster) -------------------------------------------------------------


def test_var_expansion_follows_kubernetes_rules() -> None:
    known = {"A": "a", "B": "b"}.get
    assert expand("$(A)-$(B)", known) == "a-b"
    assert expand("$$(A)", known) == "$(A)"  # escaped
    assert expand("$(MISSING)", known) == "$(MISSING)"  # unknown stays verbatim
    assert expand("$(A", known) == "$(A"  # unclosed
    assert expand("a$$$(A)$", known) == "a$a$"


# ---- node and scheduling -----------------------------------------------------------------


def test_node_is_registered_ready_with_gpus(core: client.CoreV1Api, kube_api: client.ApiClient):
    def our_node() -> client.V1Node | None:
        return next((n for n in core.list_node().items if n.metadata.name == NODE), None)

    node = wait_for(our_node, "the pod runner's node")
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    assert [a.address for a in node.status.addresses] == ["127.0.0.1"]
    assert node.status.daemon_endpoints.kubelet_endpoint.port > 0
    assert not [t for t in node.spec.taints or [] if t.key == "node.kubernetes.io/not-ready"]
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(NODE, "kube-node-lease")
    assert lease.spec.holder_identity == NODE


def test_http_pod_becomes_ready_and_is_reachable(core: client.CoreV1Api, ns: str) -> None:
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    manifest = pod(
        "web",
        HTTP_SERVER,
        container={
            "env": [POD_IP_ENV],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": probe,
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        },
    )
    core.create_namespaced_pod(ns, manifest)
    p = wait_ready(core, ns, "web")
    assert p.spec.node_name == NODE
    assert p.status.phase == "Running"
    assert p.status.pod_ip.startswith("127.0.") and p.status.pod_ip != "127.0.0.1"
    assert p.status.host_ip == "127.0.0.1"
    cs = p.status.container_statuses[0]
    assert cs.ready and cs.started and cs.state.running and cs.container_id.startswith("process://")
    kinds = {c.type: c.status for c in p.status.conditions}
    assert kinds["PodScheduled"] == kinds["Initialized"] == kinds["ContainersReady"] == "True"
    assert http_get(p.status.pod_ip) == 200


def test_env_resolution(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "cm"}, "data": {"greeting": "hello", "extra": "x"}}
    )
    core.create_namespaced_secret(
        ns, {"metadata": {"name": "sec"}, "stringData": {"password": "s3cret"}}
    )
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    env = [
        {"name": "POD_NAME", **field("metadata.name")},
        {"name": "POD_NS", **field("metadata.namespace")},
        {"name": "POD_UID", **field("metadata.uid")},
        {"name": "APP", **field("metadata.labels['app']")},
        {"name": "NODE", **field("spec.nodeName")},
        {"name": "SA", **field("spec.serviceAccountName")},
        POD_IP_ENV,
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "greeting"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
        {
            "name": "OPT",
            "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}},
        },
        {"name": "COMBINED", "value": "$(GREETING)-$(POD_NAME)-$$(ESC)-$(UNDEFINED)"},
    ]
    script = (
        "import json, os, sys; keys = sys.argv[1:]; "
        "print(json.dumps({k: os.environ.get(k) for k in keys}))"
    )
    keys = [e["name"] for e in env] + ["CM_extra", "KUBERNETES_SERVICE_HOST", "TMPDIR"]
    manifest = pod(
        "envs",
        ["python", "-c", script],
        restartPolicy="Never",
        container={
            "env": env,
            "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
            "args": [*keys, "$(GREETING)"],
        },
    )
    core.create_namespaced_pod(ns, manifest)
    p = wait_phase(core, ns, "envs", ("Succeeded", "Failed"))
    assert p.status.phase == "Succeeded", p.status
    got = last_json_line(core.read_namespaced_pod_log("envs", ns))
    assert got["POD_NAME"] == "envs" and got["POD_NS"] == ns and got["POD_UID"] == p.metadata.uid
    assert got["APP"] == "envs" and got["NODE"] == NODE and got["SA"] == "default"
    assert got["POD_IP"] == p.status.pod_ip
    assert got["GREETING"] == "hello" and got["PASSWORD"] == "s3cret" and got["OPT"] is None
    assert got["COMBINED"] == "hello-envs-$(ESC)-$(UNDEFINED)"
    assert got["CM_extra"] == "x" and got["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert got["hello"] is None  # "$(GREETING)" in args became a key nobody set
    assert "/pods/" in got["TMPDIR"]


def test_missing_configmap_waits_then_starts(core: client.CoreV1Api, ns: str) -> None:
    env = [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "later", "key": "x"}}}]
    core.create_namespaced_pod(
        ns, pod("waits", ["python", "-c", "import time; time.sleep(600)"], container={"env": env})
    )

    def waiting_reason() -> str | None:
        cs = read(core, ns, "waits").status.container_statuses
        return cs and cs[0].state.waiting and cs[0].state.waiting.reason

    assert wait_for(waiting_reason, "a waiting reason", 30) == "CreateContainerConfigError"
    core.create_namespaced_config_map(ns, {"metadata": {"name": "later"}, "data": {"x": "1"}})
    wait_phase(core, ns, "waits", ("Running",), 30)


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
    time.sleep(0.5)  # let the interpreter install its SIGTERM handler
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


def test_kubectl_logs(core: client.CoreV1Api, ns: str, kubectl: Kubectl) -> None:
    script = (
        "import sys, time\n"
        "for i in range(1, 6): print(f'line-{i}', flush=True)\n"
        "print('to-stderr', file=sys.stderr, flush=True)\n"
        "time.sleep(600)\n"
    )
    core.create_namespaced_pod(ns, pod("talker", ["python", "-c", script]))
    wait_phase(core, ns, "talker", ("Running",))

    def all_lines() -> str:
        out = kubectl("logs", "-n", ns, "talker").stdout
        return out if "to-stderr" in out else ""

    out = wait_for(all_lines, "the log lines", 20)
    assert [ln for ln in out.splitlines() if ln.startswith("line-")] == [
        f"line-{i}" for i in range(1, 6)
    ]
    assert kubectl("logs", "-n", ns, "talker", "--tail=2").stdout.splitlines() == [
        "line-5",
        "to-stderr",
    ]
    stamped = kubectl("logs", "-n", ns, "talker", "--timestamps", "--tail=1").stdout.strip()
    assert stamped.endswith(" to-stderr") and stamped[:4].isdigit() and "T" in stamped.split()[0]


def test_missing_command_is_reported_failed(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("nocmd", ["no-such-binary-genpool"], restartPolicy="Never"))
    p = wait_phase(core, ns, "nocmd", ("Failed",), 30)
    term = p.status.container_statuses[0].state.terminated
    assert term.reason == "ContainerCannotRun"
    assert "no-such-binary-genpool" in term.message and "not found" in term.message
    # With restartPolicy Always it keeps trying, in back-off, and says why.
    core.create_namespaced_pod(ns, pod("nocmd2", ["no-such-binary-genpool"]))

    def backing_off() -> client.V1ContainerStatus | None:
        cs = read(core, ns, "nocmd2").status.container_statuses
        return cs[0] if cs and cs[0].last_state.terminated and cs[0].state.waiting else None

    cs = wait_for(backing_off, "CrashLoopBackOff", 30)
    assert cs.state.waiting.reason == "CrashLoopBackOff"
    assert cs.last_state.terminated.reason == "ContainerCannotRun"


def test_pod_kubeconfig_token_is_subject_to_rbac(core: client.CoreV1Api, ns: str) -> None:
    script = """
import json
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_kube_config()  # $KUBECONFIG, written by the pod runner
api = client.ApiClient()
review = client.AuthenticationV1Api(api).create_self_subject_review({})
try:
    client.CoreV1Api(api).list_namespaced_secret(config.list_kube_config_contexts()[1]["context"]["namespace"])
    secrets = 200
except ApiException as err:
    secrets = err.status
print(json.dumps({"user": review.status.user_info.username, "secrets": secrets}))
"""
    core.create_namespaced_pod(ns, pod("whoami", ["python", "-c", script], restartPolicy="Never"))
    p = wait_phase(core, ns, "whoami", ("Succeeded", "Failed"), 60)
    logs = core.read_namespaced_pod_log("whoami", ns)
    assert p.status.phase == "Succeeded", logs
    got = last_json_line(logs)
    assert got["user"] == f"system:serviceaccount:{ns}:default"
    assert got["secrets"] == 403


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
