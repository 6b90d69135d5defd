"""Helpers for the Helm chart tests: a helm binary and `helm template` rendering.

helm comes from the devcluster's tool cache (the npm layer package,
docs/design.md#local-control-plane). When it
cannot be had, the tests fail rather than skip: a chart nobody renders is a chart nobody tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from genpool_devcluster import build

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "genpool"
RELEASE = "gp"
NAMESPACE = "genpool-system"

# The kopf peering kinds the chart checks for before rendering peering objects.
PEERING_API_VERSIONS = ("kopf.dev/v1/ClusterKopfPeering", "kopf.dev/v1/KopfPeering")


def helm_path() -> Path:
    try:
        return build.ensure_tools() / "helm"
    except Exception as exc:  # any failure to fetch helm is a test failure, never a skip
        pytest.fail(f"helm is not available ({exc}); the chart tests need it", pytrace=False)


def run_helm(
    *args: str, values: dict[str, Any] | None = None, tmp_path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm_path()), *args]
    if values:
        assert tmp_path is not None, "values need a tmp_path for the values file"
        vfile = tmp_path / f"values-{abs(hash(repr(values)))}.yaml"
        vfile.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(vfile)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def template_args(
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: Iterable[str] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for api in api_versions:
        args += ["--api-versions", api]
    return [*args, *extra]


def render(
    values: dict[str, Any] | None,
    tmp_path: Path,
    *,
    api_versions: Iterable[str] = (),
    extra: Sequence[str] = (),
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> list[dict[str, Any]]:
    """`helm template` of the chart; the rendered objects (empty documents dropped)."""
    res = run_helm(
        *template_args(release, namespace, api_versions, extra), values=values, tmp_path=tmp_path
    )
    assert res.returncode == 0, f"helm template failed:\n{res.stderr}"
    return [doc for doc in yaml.safe_load_all(res.stdout) if doc]


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


# Named value sets every render-level test runs over. Peering cases need the kopf peering
# kinds announced as served (the chart refuses to render peering objects otherwise).
CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "default": ({}, ()),
    "namespaced": ({"rbac": {"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]}}, ()),
    "namespaced-release-ns": ({"rbac": {"scope": "namespaced"}}, ()),
    "monitoring": (
        {
            "monitoring": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                "podMonitor": {"enabled": True},
            },
            "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "GenPool"}},
        },
        (),
    ),
    "peering": ({"operator": {"replicas": 2}}, PEERING_API_VERSIONS),
    "peering-namespaced": (
        {"operator": {"replicas": 3}, "rbac": {"scope": "namespaced", "watchNamespaces": ["a"]}},
        PEERING_API_VERSIONS,
    ),
    "existing-secret": (
        {"adminToken": {"existingSecret": "my-admin", "existingSecretKey": "tok"}},
        (),
    ),
    "external-sa": ({"serviceAccount": {"create": False, "name": "ops-sa"}}, ()),
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    """(case name, rendered objects) for every entry of CASES."""
    values, apis = CASES[request.param]
    return request.param, render(values, tmp_path, api_versions=apis)


Objs = list[dict[str, Any]]


def by_name(objs: Objs, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in of_kind(objs, kind)}


def workload(objs: Objs) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(found) == 1, [o["kind"] for o in found]
    return found[0]


def container(objs: Objs) -> dict[str, Any]:
    (c,) = workload(objs)["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c["env"]}
