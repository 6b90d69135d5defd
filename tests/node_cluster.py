"""The real node's cluster and the chart's operator on it, shared by the node and e2e tiers
(the fixtures in tests/conftest.py wire these; docs/devcluster.md#the-real-node).

One node cluster per session: the control plane plus containerd, runc, CNI, a kubelet,
kube-scheduler and kube-proxy, with the worker and operator images built from the shipped
Dockerfiles and imported. The chart is installed once, as users install it; its operator
runs in a container on the node and watches every namespace, so each test's pools live in
a namespace of their own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from tests.conftest import START_TIMEOUT_S, DevCluster, Kubectl
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[1]
RELEASE, OPERATOR_NS = "genpool", "genpool-system"
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
METRICS_PORT = 8081  # the chart's operator.metricsPort


@contextmanager
def node_cluster() -> Iterator[DevCluster]:
    """A started node cluster, or the one GENPOOL_NODE_KUBECONFIG points at."""
    from genpool_devcluster import build
    from genpool_devcluster.cluster import Cluster
    from genpool_devcluster.node.runtime import ensure_host

    existing = os.environ.get("GENPOOL_NODE_KUBECONFIG")
    if existing:
        yield DevCluster(Path(existing), build.ensure_tools(), None)
        return
    archives = ensure_host(REPO)
    bin_dir = build.bin_dir()
    # One state dir for every session: the node's image store (gigabytes, minutes to
    # import) stays; the API's data is wiped, so each session starts from empty.
    state_dir = build.cache_dir() / "node-tests"
    with build.file_lock(state_dir / "session.lock"):  # a second session waits for the first
        shutil.rmtree(state_dir / "etcd", ignore_errors=True)
        c = Cluster(state_dir, bin_dir=bin_dir, runtime="node", images=archives)
        try:
            c.start(timeout=START_TIMEOUT_S)
            yield DevCluster(c.kubeconfig, bin_dir, state_dir)
        finally:
            c.stop()


def helm(cluster: DevCluster, *args: str) -> str:
    cmd = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"helm {' '.join(args)}: {res.stderr}"
    return res.stdout


def pod_process(pod_uid: str, program: str) -> int:
    """The pid, seen from this host, of ``program`` in that pod: its cgroup names the pod."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroup = (proc / "cgroup").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"pod{pod_uid}" in cgroup and any(a.endswith(program.encode()) for a in cmdline):
            return int(proc.name)
    raise AssertionError(f"no {program} process in pod {pod_uid}")


class ChartOperator:
    """The chart's operator pod: its metrics, and a crash the kubelet recovers from."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def pod(self) -> client.V1Pod:
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            OPERATOR_NS, label_selector=OPERATOR_SELECTOR
        )
        running = [p for p in pods.items if p.metadata.deletion_timestamp is None]
        assert len(running) == 1, [p.metadata.name for p in pods.items]
        pod: client.V1Pod = running[0]
        return pod

    def _containers(self) -> list[client.V1ContainerStatus]:
        return self.pod().status.container_statuses or []

    def restarts(self) -> int:
        return sum(s.restart_count for s in self._containers())

    def is_ready(self) -> bool:
        statuses = self._containers()
        return bool(statuses) and all(s.ready for s in statuses)

    def kill(self) -> None:
        """SIGKILL from this host: no cleanup handler runs, as when the process dies
        mid-reconcile; the kubelet restarts the container (returns at once)."""
        os.kill(pod_process(self.pod().metadata.uid, "genpool-operator"), signal.SIGKILL)

    def metrics(self) -> str:
        url = f"http://{self.pod().status.pod_ip}:{METRICS_PORT}/metrics"
        return httpx.get(url, timeout=5).text

    def rounds(self, namespace: str, pool: str) -> float:
        """Stats rounds run for a pool (its round-duration histogram's count)."""
        labels = f'namespace="{namespace}",pool="{pool}"'
        series = f"genpool_operator_round_duration_seconds_count{{{labels}}} "
        lines = [ln for ln in self.metrics().splitlines() if ln.startswith(series)]
        return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


@contextmanager
def installed_chart(
    cluster: DevCluster, kubectl: Kubectl, api: client.ApiClient
) -> Iterator[ChartOperator]:
    """The chart installed as users install it (CRD included), its operator Ready."""
    helm(cluster, "upgrade", "--install", RELEASE, str(REPO / "charts" / "genpool"),
         "-n", OPERATOR_NS, "--create-namespace", "--set", "operator.verbose=true")  # fmt: skip
    wait_for(
        lambda: kubectl(
            "get", "deploy", "-n", OPERATOR_NS, "-o", "jsonpath={.items[0].status.readyReplicas}"
        ).stdout == "1",
        timeout=120,
        what="the operator Deployment ready on the node",
    )  # fmt: skip
    yield ChartOperator(api)
    helm(cluster, "uninstall", RELEASE, "-n", OPERATOR_NS)


# The conftest of each directory whose tests run on the real node imports these three, so
# there the shared fixtures (``namespace`` and the tests') use the session's node cluster.
@pytest.fixture(scope="session")
def cluster(node_cluster: DevCluster) -> DevCluster:
    return node_cluster


@pytest.fixture(scope="session")
def kube_api(node_api: client.ApiClient) -> client.ApiClient:
    return node_api


@pytest.fixture(scope="session")
def kubectl(node_kubectl: Kubectl) -> Kubectl:
    return node_kubectl
