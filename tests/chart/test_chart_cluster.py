"""The chart against the local control plane (devcluster): server-side dry-run with strict
field validation, install/upgrade/uninstall, and the operator's RBAC as the apiserver
decides it (`kubectl auth can-i --as=<its ServiceAccount>`).

ServiceMonitor/PodMonitor are not dry-run here: the Prometheus Operator's CRDs are not
installed in the devcluster (their rendering is checked offline in test_chart_render.py).
The operator pods are never waited for: whether they become ready depends on the pod
runner and the operator, not on the chart.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.conftest import DevCluster, Kubectl
from tests.integration.inference_pool_harness import INFERENCE_POOL_CRD
from tests.polling import wait_until

from .conftest import CHART, PEERING_API_VERSIONS, helm_path
from .test_chart_rbac import POOL_RULES

Helm = Callable[..., subprocess.CompletedProcess[str]]
ALL_VERBS = ("get", "list", "watch", "create", "patch", "update", "delete", "deletecollection")
EXAMPLE_POOL = {
    "apiVersion": "genpool.dev/v1alpha1",
    "kind": "GenPool",
    "metadata": {"name": "demo"},
    "spec": {
        "replicas": 2,
        "model": "synthetic:demo",
        "accelerator": "none",
        "preemption": {"mode": "TpotBudget", "tpotBudget": 0.05},
    },
}


@pytest.fixture(scope="module")
def helm(cluster: DevCluster) -> Helm:
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(helm_path()), "--kubeconfig", str(cluster.kubeconfig), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if check and res.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res

    return run


@pytest.fixture(scope="module")
def crds(kubectl: Kubectl) -> None:
    """GenPool's CRD (as helm's crds/ would install it), kopf's peering CRDs, and GIE's
    InferencePool CRD: `kubectl auth can-i` resolves a resource through discovery, so the
    operator's inferencepools rule can only be checked while the CRD is served."""
    for path in (
        CHART / "crds" / "genpool.dev_genpools.yaml",
        CHART / "files/kopf-peering-crds.yaml",
        INFERENCE_POOL_CRD,
    ):
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/genpools.genpool.dev",
        "crd/clusterkopfpeerings.kopf.dev",
        "crd/kopfpeerings.kopf.dev",
        "crd/inferencepools.inference.networking.k8s.io",
    )


def make_namespace(api: client.ApiClient) -> str:
    name = f"chart-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    return name


@pytest.fixture
def namespaces(kube_api: client.ApiClient) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def new() -> str:
        made.append(make_namespace(kube_api))
        return made[-1]

    yield new
    for name in made:
        client.CoreV1Api(kube_api).delete_namespace(name)


def template(helm: Helm, release: str, namespace: str, values: dict[str, Any], tmp: Path) -> str:
    vfile = tmp / f"{release}-values.yaml"
    vfile.write_text(yaml.safe_dump(values))
    args = ["template", release, str(CHART), "-n", namespace, "-f", str(vfile)]
    for api in PEERING_API_VERSIONS:
        args += ["--api-versions", api]
    return helm(*args).stdout


# ---- server-side dry-run ---------------------------------------------------------------------


def test_server_side_dry_run_strict(
    helm: Helm,
    kubectl: Kubectl,
    crds: None,
    namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    ns, watched = namespaces(), namespaces()
    cases = {
        "default": {"grafanaDashboard": {"enabled": True}},
        "namespaced": {"rbac": {"scope": "namespaced", "watchNamespaces": [watched]}},
        "peering": {"operator": {"replicas": 2}},
        "peering-namespaced": {
            "operator": {"replicas": 2},
            "rbac": {"scope": "namespaced", "watchNamespaces": [watched]},
        },
        "existing-secret": {"adminToken": {"existingSecret": "mine"}},
    }
    for name, values in cases.items():
        docs = [d for d in yaml.safe_load_all(template(helm, "dry", ns, values, tmp_path)) if d]
        docs = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
        stream = yaml.safe_dump_all(docs)
        res = kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=stream, check=False
        )
        assert res.returncode == 0, f"[{name}] {res.stderr}"
        assert len(res.stdout.strip().splitlines()) == len(docs), res.stdout
    # The NOTES.txt example pool is a valid GenPool.
    res = kubectl(
        "apply", "-n", ns, "--dry-run=server", "--validate=strict", "-f", "-",
        input=yaml.safe_dump(EXAMPLE_POOL), check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


# ---- RBAC as the apiserver sees it ----------------------------------------------------------


def resource_arg(group: str, resource: str) -> list[str]:
    base, _, sub = resource.partition("/")
    arg = f"{base}.{group}" if group else base
    return [arg, f"--subresource={sub}"] if sub else [arg]


def can_i_all(
    kubectl: Kubectl,
    sa: str,
    checks: list[tuple[str, str, str, str | None]],
) -> dict[tuple[str, str, str, str | None], bool]:
    """{(verb, group, resource, namespace or None for all): allowed} for the ServiceAccount."""

    def one(check: tuple[str, str, str, str | None]) -> bool:
        verb, group, resource, ns = check
        scope = ["-n", ns] if ns else ["--all-namespaces"]
        res = kubectl("auth", "can-i", verb, *resource_arg(group, resource), *scope,
                      f"--as={sa}", check=False)  # fmt: skip
        answer = res.stdout.strip()
        assert answer in ("yes", "no"), res.stderr
        return answer == "yes"

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(checks, pool.map(one, checks), strict=True))


def assert_matrix(
    kubectl: Kubectl,
    sa: str,
    allowed_in: list[str | None],
    denied_in: list[str | None],
    extra_allowed: dict[tuple[str, str], frozenset[str]],
) -> None:
    expected: dict[tuple[str, str, str, str | None], bool] = {}
    rules = {**POOL_RULES, **extra_allowed}
    for (group, resource), verbs in rules.items():
        for verb in ALL_VERBS:
            for ns in allowed_in:
                expected[(verb, group, resource, ns)] = verb in verbs
            for ns in denied_in:
                expected[(verb, group, resource, ns)] = False
    # Secrets can never be read, anywhere.
    for ns in [*allowed_in, *denied_in, "kube-system", None]:
        for verb in ("get", "list", "watch"):
            expected[(verb, "", "secrets", ns)] = False
    # A sample of what an operator must not touch.
    for ns in [*allowed_in, None]:
        for verb, group, resource in [
            ("create", "apps", "deployments"),
            ("get", "apps", "deployments"),
            ("create", "", "pods"),
            ("delete", "", "pods"),
            ("create", "", "pods/exec"),
            ("create", "", "serviceaccounts/token"),
            ("create", "rbac.authorization.k8s.io", "roles"),
            ("create", "rbac.authorization.k8s.io", "rolebindings"),
        ]:
            expected[(verb, group, resource, ns)] = False
    for verb, group, resource in [
        ("list", "", "nodes"),
        ("get", "", "nodes"),
        ("create", "", "namespaces"),
        ("delete", "", "namespaces"),
        ("get", "rbac.authorization.k8s.io", "clusterroles"),
        ("create", "rbac.authorization.k8s.io", "clusterroles"),
        ("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
        ("create", "apiextensions.k8s.io", "customresourcedefinitions"),
        ("delete", "apiextensions.k8s.io", "customresourcedefinitions"),
        ("get", "apiextensions.k8s.io", "customresourcedefinitions"),
    ]:
        expected[(verb, group, resource, None)] = False
    expected[("list", "apiextensions.k8s.io", "customresourcedefinitions", None)] = True
    expected[("watch", "apiextensions.k8s.io", "customresourcedefinitions", None)] = True
    got = can_i_all(kubectl, sa, list(expected))
    wrong = {k: v for k, v in got.items() if v != expected[k]}
    assert not wrong, f"can-i answers differ (key: verb, group, resource, ns): {wrong}"


def leftovers(kubectl: Kubectl, release: str) -> list[str]:
    selector = f"app.kubernetes.io/instance={release}"
    namespaced = (
        "deployments,statefulsets,pods,secrets,serviceaccounts,configmaps,roles,rolebindings,"
        "kopfpeerings"
    )
    found = kubectl("get", namespaced, "-A", "-l", selector, "-o", "name").stdout.split()
    found += kubectl(
        "get", "clusterroles,clusterrolebindings,clusterkopfpeerings", "-l", selector, "-o", "name"
    ).stdout.split()
    return found


def assert_uninstalled(kubectl: Kubectl, release: str) -> None:
    # Pods go asynchronously (garbage collector, then the pod runner's grace period).
    wait_until(lambda: leftovers(kubectl, release), lambda left: not left,
               "uninstall to leave none of the release's objects", 90, interval=2)  # fmt: skip
    kubectl("get", "crd", "genpools.genpool.dev")  # helm never deletes crds/ CRDs


def secret_token(kubectl: Kubectl, ns: str, name: str) -> str:
    return kubectl("get", "secret", "-n", ns, name, "-o", "jsonpath={.data.token}").stdout


def test_install_upgrade_uninstall_cluster_scope(
    helm: Helm,
    kubectl: Kubectl,
    crds: None,
    namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    ns, other = namespaces(), namespaces()
    release = "gpc"
    # helm 4 waits only for hooks by default; no --wait: the pods' readiness is not ours.
    helm("install", release, str(CHART), "-n", ns, "--timeout", "2m")
    token = secret_token(kubectl, ns, f"{release}-admin-token")
    assert len(token) > 40

    values = tmp_path / "up.yaml"
    values.write_text(yaml.safe_dump({"operator": {"resources": {"limits": {"memory": "768Mi"}}}}))
    helm("upgrade", release, str(CHART), "-n", ns, "-f", str(values), "--timeout", "2m")
    limits = kubectl(
        "get", "deployment", "-n", ns, f"{release}-genpool",
        "-o", "jsonpath={.spec.template.spec.containers[0].resources.limits.memory}",
    ).stdout  # fmt: skip
    assert limits == "768Mi"
    # The token survives the upgrade (lookup of the live Secret).
    assert secret_token(kubectl, ns, f"{release}-admin-token") == token
    assert "deployed" in helm("status", release, "-n", ns).stdout

    sa = f"system:serviceaccount:{ns}:{release}-genpool"
    assert_matrix(
        kubectl,
        sa,
        allowed_in=[ns, other, None],
        denied_in=[],
        extra_allowed={("", "namespaces"): frozenset({"list", "watch"})},
    )

    helm("uninstall", release, "-n", ns, "--timeout", "2m")
    assert_uninstalled(kubectl, release)


def test_install_namespaced_with_peering(
    helm: Helm,
    kubectl: Kubectl,
    crds: None,
    namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    ns, watched, other = namespaces(), namespaces(), namespaces()
    release = "gpn"
    values = tmp_path / "ns.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "operator": {"replicas": 2},
                "rbac": {"scope": "namespaced", "watchNamespaces": [watched]},
            }
        )
    )
    helm("install", release, str(CHART), "-n", ns, "-f", str(values), "--timeout", "2m")
    kubectl("get", "statefulset", "-n", ns, f"{release}-genpool")
    kubectl("get", "kopfpeering", "-n", watched, release)
    # Each operator pod's kopf priority comes from this label: they must differ.
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
    jsonpath = "{range .items[*]}{.metadata.labels.apps\\.kubernetes\\.io/pod-index}{'\\n'}{end}"

    def pod_indices() -> list[str]:
        out = kubectl("get", "pods", "-n", ns, "-l", selector, "-o", f"jsonpath={jsonpath}")
        return sorted(out.stdout.split())

    wait_until(pod_indices, lambda got: got == ["0", "1"], "operator pods 0 and 1", 60, interval=1)

    sa = f"system:serviceaccount:{ns}:{release}-genpool"
    assert_matrix(
        kubectl,
        sa,
        allowed_in=[watched],
        denied_in=[ns, other, None],
        extra_allowed={("kopf.dev", "kopfpeerings"): frozenset({"list", "watch", "patch"})},
    )
    # Namespaced scope: kopf may not list namespaces, nor touch cluster peerings.
    got = can_i_all(
        kubectl,
        sa,
        [
            ("list", "", "namespaces", None),
            ("patch", "kopf.dev", "clusterkopfpeerings", None),
            ("patch", "kopf.dev", "kopfpeerings", other),
        ],
    )
    assert not any(got.values()), got

    helm("uninstall", release, "-n", ns, "--timeout", "2m")
    assert_uninstalled(kubectl, release)
