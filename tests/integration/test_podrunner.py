"""The pod runner plays scheduler + kubelet: real pods through the real apiserver.

Every test here needs the `cluster` fixture, which fails (never skips) when no control plane can
be started. Containers run `python` from this project's venv (the runner puts its bin dir first
on PATH); the images named are never pulled.
"""

from __future__ import annotations

from kubernetes import client

from genpool_devcluster.podrunner.env import expand
from tests.conftest import Kubectl
from tests.integration.podrunner_support import (
    HTTP_SERVER,
    NODE,
    POD_IP_ENV,
    http_get,
    last_json_line,
    pod,
    read,
    wait_phase,
    wait_ready,
)
from tests.polling import wait_for

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
