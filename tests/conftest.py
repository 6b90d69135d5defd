"""Test tiers, and the one session-wide control plane the cluster tiers share.

Tiers (a marker per test, from its directory, so `pytest -m TIER` selects one):

    unit     tests/unit          pure: no torch, no kubernetes, no kopf (`make unit` enforces it)
    model    tests/model         the torch model against references
    worker   tests/worker        a real worker process around the synthetic model
    cluster  tests/integration,  a real control plane (devcluster) and the Helm chart
             tests/chart
    e2e      tests/e2e           the whole product (the chart's operator, autoscaling, P/D, the
                                 demo's pools) on the real node
    node     tests/node          what a real node adds: containerd, runc and a kubelet run
                                 the images built from the shipped Dockerfiles

The cluster fixtures live here, at the top, so that the tiers share one cluster of each kind
per session: the pod runner's (`cluster`, for integration and chart tests) and the real
node's (`node_cluster`, which tests/e2e and tests/node make their `cluster`). They import
kubernetes and the devcluster only when a test asks for them, so collecting the unit tier
imports neither.

`cluster` reuses the cluster that GENPOOL_KUBECONFIG points at when it answers, else builds (or
reuses cached) binaries and starts a fresh one in a temp state dir. A cluster that cannot start
is an error, never a skip: these tests exist to prove that it starts.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubernetes import client

    from tests.integration.operator_harness import OperatorProcess
    from tests.node_cluster import ChartOperator

TESTS = Path(__file__).resolve().parent
TIER_OF_DIR = {
    "unit": "unit",
    "model": "model",
    "worker": "worker",
    "integration": "cluster",
    "chart": "cluster",
    "e2e": "e2e",
    "node": "node",
}
START_TIMEOUT_S = 300.0


def tier_of(path: Path) -> str:
    """The tier of a test file: its first directory under tests/ decides."""
    parts = path.resolve().relative_to(TESTS).parts
    if len(parts) < 2 or parts[0] not in TIER_OF_DIR:
        raise pytest.UsageError(
            f"{path}: every test lives in a tier directory ({', '.join(sorted(TIER_OF_DIR))});"
            " add the new directory to TIER_OF_DIR in tests/conftest.py"
        )
    return TIER_OF_DIR[parts[0]]


# Seconds spent per tier (set-up, call and tear-down of its tests), printed at the end of
# the run so that CI's log shows where the suite's budget goes (docs/architecture.md).
_TIER_OF_TEST: dict[str, str] = {}
_TIER_SECONDS: dict[str, float] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(tier)
        _TIER_OF_TEST[item.nodeid] = tier


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = _TIER_OF_TEST.get(report.nodeid, "other")
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _TIER_SECONDS:
        spent = ", ".join(f"{t} {s / 60:.1f} min" for t, s in sorted(_TIER_SECONDS.items()))
        terminalreporter.write_line(f"time by tier: {spent}")


@dataclass(frozen=True)
class DevCluster:
    kubeconfig: Path
    bin_dir: Path
    state_dir: Path | None  # None when reusing a cluster someone else runs


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _answers(kubeconfig: str) -> bool:
    from kubernetes import client, config

    try:
        api = config.new_client_from_config(config_file=kubeconfig)
        with api:
            client.VersionApi(api).get_code(_request_timeout=5)
        return True
    except Exception:  # any failure means "start our own"
        return False


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    from genpool_devcluster import build
    from genpool_devcluster.cluster import Cluster

    existing = os.environ.get("GENPOOL_KUBECONFIG")
    if existing and _answers(existing):
        yield DevCluster(Path(existing), build.ensure_tools(), None)
        return
    bin_dir = build.ensure_binaries()
    state_dir = tmp_path_factory.mktemp("devcluster")
    c = Cluster(state_dir, bin_dir=bin_dir).start(timeout=START_TIMEOUT_S)
    try:
        yield DevCluster(c.kubeconfig, bin_dir, state_dir)
    finally:
        c.stop()


def api_client(cluster: DevCluster) -> Iterator[client.ApiClient]:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    with api:
        yield api


@pytest.fixture(scope="session")
def kube_api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    yield from api_client(cluster)


@pytest.fixture(scope="session")
def kubectl(cluster: DevCluster) -> Kubectl:
    return kubectl_runner(cluster)


def kubectl_runner(cluster: DevCluster) -> Kubectl:
    """kubectl(*args, input=None, check=True) with the cluster's kubeconfig."""

    def run(
        *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res

    return run


@pytest.fixture
def namespace(kube_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (not waited for: the namespace controller finishes)."""
    from kubernetes import client

    name = f"it-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def crd(kubectl: Kubectl) -> None:
    """The GenPool CRD installed (from crds/)."""
    from tests.integration.operator_harness import install_genpool_crd

    install_genpool_crd(kubectl)


@pytest.fixture
def operator(
    cluster: DevCluster, crd: None, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator, in its own process, watching the test's namespace."""
    from tests.integration.operator_harness import OperatorProcess

    proc = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log").start()
    yield proc
    proc.stop()
    print(proc.log_tail())


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[DevCluster]:
    """The real node's cluster (tests/node_cluster.py), started once per session."""
    from tests.node_cluster import node_cluster

    with node_cluster() as started:
        yield started


@pytest.fixture(scope="session")
def node_api(node_cluster: DevCluster) -> Iterator[client.ApiClient]:
    yield from api_client(node_cluster)


@pytest.fixture(scope="session")
def node_kubectl(node_cluster: DevCluster) -> Kubectl:
    return kubectl_runner(node_cluster)


@pytest.fixture(scope="session")
def node_chart(
    node_cluster: DevCluster, node_kubectl: Kubectl, node_api: client.ApiClient
) -> Iterator[ChartOperator]:
    """The chart installed on the real node; its operator watches every namespace."""
    from tests.node_cluster import installed_chart

    with installed_chart(node_cluster, node_kubectl, node_api) as operator:
        yield operator
