"""The e2e tier runs on the real node's cluster (tests/node_cluster.py), as users run
GenPool: the chart's operator in a container watches every namespace, and each test's pools
run as containers from the worker image in the test's own namespace."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.node_cluster import cluster, kube_api, kubectl

if TYPE_CHECKING:
    from tests.node_cluster import ChartOperator

__all__ = ["cluster", "kube_api", "kubectl", "operator"]


@pytest.fixture
def operator(node_chart: ChartOperator) -> ChartOperator:
    """The chart's operator (it already watches the test's namespace)."""
    return node_chart
