"""The chart's RBAC and kopf peering, rendered offline: least privilege, exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from genpool_core.names import (
    API_GROUP,
    API_PLURAL,
    INFERENCE_POOL_GROUP,
    INFERENCE_POOL_PLURAL,
)

from .conftest import (
    CASES,
    CHART,
    NAMESPACE,
    PEERING_API_VERSIONS,
    RELEASE,
    Objs,
    by_name,
    container,
    env_of,
    of_kind,
    one,
    render,
    run_helm,
    template_args,
    workload,
)

POOL_VERBS = frozenset({"get", "list", "watch", "create", "patch", "update", "delete"})
# (apiGroup, resource) -> verbs: the whole of what the operator may do to pool resources.
POOL_RULES: dict[tuple[str, str], frozenset[str]] = {
    (API_GROUP, API_PLURAL): frozenset({"get", "list", "watch", "patch", "update"}),
    (API_GROUP, f"{API_PLURAL}/status"): frozenset({"get", "patch", "update"}),
    ("", "events"): frozenset({"create", "patch"}),
    ("events.k8s.io", "events"): frozenset({"create", "patch"}),
    ("apps", "statefulsets"): POOL_VERBS,
    ("apps", "statefulsets/scale"): frozenset({"get", "patch"}),
    ("", "services"): POOL_VERBS,
    ("", "configmaps"): POOL_VERBS,
    ("policy", "poddisruptionbudgets"): POOL_VERBS,
    (INFERENCE_POOL_GROUP, INFERENCE_POOL_PLURAL): POOL_VERBS,
    ("", "secrets"): frozenset({"create", "patch", "update", "delete"}),
    ("", "pods"): frozenset({"get", "list", "watch"}),
    ("", "pods/log"): frozenset({"get"}),
}
CRD_RULE = {("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"})}
NAMESPACES_RULE = {("", "namespaces"): frozenset({"list", "watch"})}
PEERING_VERBS = frozenset({"list", "watch", "patch"})


def flatten(rules: list[dict[str, Any]]) -> dict[tuple[str, str], frozenset[str]]:
    """Rules as (group, resource) -> verbs, asserting nothing is granted twice or by name."""
    out: dict[tuple[str, str], frozenset[str]] = {}
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames etc.
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key not in out, f"{key} granted twice"
                out[key] = frozenset(rule["verbs"])
    return out


# ---- RBAC ----------------------------------------------------------------------------------


def test_no_wildcards_and_secrets_are_write_only(case: tuple[str, Objs]) -> None:
    name, objs = case
    for role in of_kind(objs, "ClusterRole") + of_kind(objs, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"[{name}] wildcard in {role['metadata']['name']}"
            if "secrets" in rule["resources"]:
                assert set(rule["verbs"]) == {"create", "patch", "update", "delete"}, name
    assert not of_kind(objs, "ClusterRoleBinding") or all(
        b["roleRef"]["name"] != "cluster-admin" for b in of_kind(objs, "ClusterRoleBinding")
    )


def test_cluster_scope_rbac_is_exactly_the_needed_set(tmp_path: Path) -> None:
    objs = render({}, tmp_path)
    assert not of_kind(objs, "Role") and not of_kind(objs, "RoleBinding")
    roles = by_name(objs, "ClusterRole")
    base = f"{NAMESPACE}-{RELEASE}-genpool"
    assert set(roles) == {base, f"{base}-kopf"}
    assert flatten(roles[base]["rules"]) == POOL_RULES
    assert flatten(roles[f"{base}-kopf"]["rules"]) == {**CRD_RULE, **NAMESPACES_RULE}
    sa = one(objs, "ServiceAccount")["metadata"]
    bindings = by_name(objs, "ClusterRoleBinding")
    assert set(bindings) == set(roles)
    for bname, binding in bindings.items():
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": bname,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": NAMESPACE}
        ]


@pytest.mark.parametrize(
    ("watch", "expected"),
    [(["team-a", "team-b"], ["team-a", "team-b"]), ([], [NAMESPACE])],
)
def test_namespaced_scope_uses_roles(watch: list[str], expected: list[str], tmp_path: Path) -> None:
    objs = render({"rbac": {"scope": "namespaced", "watchNamespaces": watch}}, tmp_path)
    roles = of_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == expected
    for role in roles:
        assert flatten(role["rules"]) == POOL_RULES
    bindings = of_kind(objs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == expected
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role"
        assert b["subjects"][0]["namespace"] == NAMESPACE  # the SA stays home
    # Cluster-wide, only what kopf needs to find the GenPool CRD: no pool resources, and
    # not even namespaces.
    (cr,) = of_kind(objs, "ClusterRole")
    assert flatten(cr["rules"]) == CRD_RULE
    args = container(objs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace=")] == [
        f"--namespace={n}" for n in expected
    ]


def test_external_service_account_is_bound_not_created(tmp_path: Path) -> None:
    objs = render({"serviceAccount": {"create": False, "name": "ops-sa"}}, tmp_path)
    assert not of_kind(objs, "ServiceAccount")
    assert workload(objs)["spec"]["template"]["spec"]["serviceAccountName"] == "ops-sa"
    for b in of_kind(objs, "ClusterRoleBinding"):
        assert b["subjects"][0]["name"] == "ops-sa"
    res = run_helm(*template_args(extra=["--set", "serviceAccount.create=false"]))
    assert res.returncode != 0 and "serviceAccount.name is required" in res.stderr


# ---- peering -------------------------------------------------------------------------------


def test_single_operator_has_no_peering(case: tuple[str, Objs]) -> None:
    name, objs = case
    if CASES[name][1]:
        return  # the peering cases are checked below
    assert one(objs, "Deployment")
    assert not of_kind(objs, "StatefulSet")
    assert not [o for o in objs if o["apiVersion"].startswith("kopf.dev/")]
    assert not [a for a in container(objs)["args"] if a.startswith(("--peering", "--priority"))]
    for role in of_kind(objs, "ClusterRole") + of_kind(objs, "Role"):
        assert all("kopf.dev" not in r["apiGroups"] for r in role["rules"]), name


def test_peering_cluster_scope(tmp_path: Path) -> None:
    objs = render({"operator": {"replicas": 2}}, tmp_path, api_versions=PEERING_API_VERSIONS)
    sts = one(objs, "StatefulSet")
    assert not of_kind(objs, "Deployment")
    assert sts["spec"]["replicas"] == 2
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    c = container(objs)
    assert f"--peering={RELEASE}" in c["args"]
    # Equal kopf priorities freeze every peer, so each pod gets its own: its ordinal.
    assert "--priority=$(GENPOOL_OPERATOR_PRIORITY)" in c["args"]
    assert env_of(c)["GENPOOL_OPERATOR_PRIORITY"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    peer = one(objs, "ClusterKopfPeering")
    assert peer["apiVersion"] == "kopf.dev/v1" and peer["metadata"]["name"] == RELEASE
    roles = by_name(objs, "ClusterRole")
    kopf = flatten(roles[f"{NAMESPACE}-{RELEASE}-genpool-kopf"]["rules"])
    assert kopf == {
        **CRD_RULE,
        **NAMESPACES_RULE,
        ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS,
    }
    assert flatten(roles[f"{NAMESPACE}-{RELEASE}-genpool"]["rules"]) == POOL_RULES


def test_peering_namespaced_scope(tmp_path: Path) -> None:
    values = {
        "operator": {"replicas": 2},
        "rbac": {"scope": "namespaced", "watchNamespaces": ["a", "b"]},
    }
    objs = render(values, tmp_path, api_versions=PEERING_API_VERSIONS)
    peers = of_kind(objs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peers) == ["a", "b"]
    assert not of_kind(objs, "ClusterKopfPeering")
    for role in of_kind(objs, "Role"):
        assert flatten(role["rules"]) == {**POOL_RULES, ("kopf.dev", "kopfpeerings"): PEERING_VERBS}
    (cr,) = of_kind(objs, "ClusterRole")
    assert flatten(cr["rules"]) == CRD_RULE


def test_peering_without_its_crds_fails_clearly() -> None:
    res = run_helm(*template_args(extra=["--set", "operator.replicas=2"]))
    assert res.returncode != 0
    assert "kopf-peering-crds.yaml" in res.stderr, res.stderr


def test_peering_crds_file_defines_both_kinds() -> None:
    docs = list(yaml.safe_load_all((CHART / "files" / "kopf-peering-crds.yaml").read_text()))
    kinds = {(d["spec"]["group"], d["spec"]["names"]["kind"], d["spec"]["scope"]) for d in docs}
    assert kinds == {
        ("kopf.dev", "ClusterKopfPeering", "Cluster"),
        ("kopf.dev", "KopfPeering", "Namespaced"),
    }
    for d in docs:
        kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
        # kopf patches the peers into the top-level status: no status subresource.
        assert "subresources" not in d["spec"]["versions"][0]
