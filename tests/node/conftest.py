"""The node tier's cluster: the control plane plus a real node (containerd, runc, CNI, a
kubelet, kube-scheduler, kube-proxy), with the worker and operator images built from the
shipped Dockerfiles and imported (docs/devcluster.md#the-real-node).

`cluster`, `kube_api` and `kubectl` are overridden here, so the tests of this directory
(and the shared `namespace` fixture they use) run on the node; the other tiers keep the
pod runner's cluster. Set GENPOOL_NODE_KUBECONFIG to a running node cluster (`genpool
devcluster up`) to reuse it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import START_TIMEOUT_S, DevCluster, Kubectl, api_client, kubectl_runner
from tests.node.kubelet_pools import NodePools, node_pools
from tests.polling import wait_for

if TYPE_CHECKING:
    from kubernetes import client

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster() -> Iterator[DevCluster]:
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


@pytest.fixture(scope="session")
def kube_api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    yield from api_client(cluster)


@pytest.fixture(scope="session")
def kubectl(cluster: DevCluster) -> Kubectl:
    return kubectl_runner(cluster)


RELEASE, OPERATOR_NS = "genpool", "genpool-system"


def helm(cluster: DevCluster, *args: str) -> str:
    cmd = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"helm {' '.join(args)}: {res.stderr}"
    return res.stdout


@pytest.fixture(scope="session")
def chart(cluster: DevCluster, kubectl: Kubectl) -> Iterator[str]:
    """The chart installed as users install it: its operator runs from the operator image
    in a container on the node, in-cluster credentials and all. Yields the namespace."""
    helm(cluster, "upgrade", "--install", RELEASE, str(REPO / "charts" / "genpool"),
         "-n", OPERATOR_NS, "--create-namespace", "--set", "operator.verbose=true")  # fmt: skip
    wait_for(
        lambda: kubectl(
            "get", "deploy", "-n", OPERATOR_NS, "-o", "jsonpath={.items[0].status.readyReplicas}"
        ).stdout == "1",
        timeout=120,
        what="the operator Deployment ready on the node",
    )  # fmt: skip
    yield OPERATOR_NS
    helm(cluster, "uninstall", RELEASE, "-n", OPERATOR_NS)


@pytest.fixture(scope="session")
def pools(kube_api: client.ApiClient, chart: str) -> Iterator[NodePools]:
    """test_kubelet_runs_workers.py's pools, each in its own namespace; the helm e2e asks
    for them too, so they start first and their waits overlap with it."""
    with node_pools(kube_api) as started:
        yield started
