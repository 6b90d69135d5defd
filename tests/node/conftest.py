"""The node tier runs on the real node's cluster (tests/node_cluster.py): `cluster`,
`kube_api` and `kubectl` are the session's node cluster here, so the tests of this
directory (and the shared `namespace` fixture they use) run on it. Set
GENPOOL_NODE_KUBECONFIG to a running node cluster (`genpool devcluster up`) to reuse it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.node.kubelet_pools import NodePools, node_pools
from tests.node_cluster import OPERATOR_NS, cluster, kube_api, kubectl

if TYPE_CHECKING:
    from kubernetes import client

    from tests.node_cluster import ChartOperator

__all__ = ["chart", "cluster", "kube_api", "kubectl", "pools"]


@pytest.fixture(scope="session")
def chart(node_chart: ChartOperator) -> str:
    """The chart installed as users install it: its operator runs from the operator image
    in a container on the node, in-cluster credentials and all. The operator's namespace."""
    return OPERATOR_NS


@pytest.fixture(scope="session")
def pools(kube_api: client.ApiClient, chart: str) -> Iterator[NodePools]:
    """test_kubelet_runs_workers.py's pools, each in its own namespace; the helm e2e asks
    for them too, so they start first and their waits overlap with it."""
    with node_pools(kube_api) as started:
        yield started
