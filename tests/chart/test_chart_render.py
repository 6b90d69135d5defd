"""The Helm chart, rendered offline: lint, schema validation of every built-in object,
least-privilege RBAC, pod security, peering, monitors, the admin token and CRD drift."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .conftest import (
    CASES,
    CHART,
    NAMESPACE,
    PEERING_API_VERSIONS,
    RELEASE,
    REPO,
    of_kind,
    one,
    render,
    run_helm,
    template_args,
)

Objs = list[dict[str, Any]]

# Groups whose kinds kubernetes-validate has no schema for (CRD-defined); the apiserver
# dry-run in test_chart_cluster.py covers what it can of them.
CUSTOM_GROUPS = {"monitoring.coreos.com", "kopf.dev", "genpool.dev"}

POOL_VERBS = frozenset({"get", "list", "watch", "create", "patch", "update", "delete"})
# (apiGroup, resource) -> verbs: the whole of what the operator may do to pool resources.
POOL_RULES: dict[tuple[str, str], frozenset[str]] = {
    ("genpool.dev", "genpools"): frozenset({"get", "list", "watch", "patch", "update"}),
    ("genpool.dev", "genpools/status"): frozenset({"get", "patch", "update"}),
    ("", "events"): frozenset({"create", "patch"}),
    ("events.k8s.io", "events"): frozenset({"create", "patch"}),
    ("apps", "statefulsets"): POOL_VERBS,
    ("", "services"): POOL_VERBS,
    ("", "configmaps"): POOL_VERBS,
    ("policy", "poddisruptionbudgets"): POOL_VERBS,
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


# ---- lint, schema, validation --------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n, (_, apis) in CASES.items() if not apis))
def test_helm_lint_strict(name: str, tmp_path: Path) -> None:
    # `helm lint` takes no --api-versions, so the peering cases are rendered-only.
    res = run_helm("lint", "--strict", str(CHART), values=CASES[name][0], tmp_path=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[WARNING]" not in res.stdout and "[ERROR]" not in res.stdout, res.stdout


def test_builtin_objects_validate_strictly(case: tuple[str, Objs]) -> None:
    name, objs = case
    version = kubernetes_validate.latest_version()
    checked = 0
    for obj in objs:
        group = obj["apiVersion"].rpartition("/")[0]
        if group in CUSTOM_GROUPS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"[{name}] {obj['kind']}/{obj['metadata']['name']}: {exc.message}")
        checked += 1
    assert checked >= 5, f"[{name}] only {checked} built-in objects rendered"


def test_chart_crd_validates_as_a_builtin_object(tmp_path: Path) -> None:
    objs = render({}, tmp_path, extra=["--include-crds"])
    crd = one(objs, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "genpools.genpool.dev"
    kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("operator.replicas=-1", "/operator/replicas"),
        ("operator.replicas=two", "/operator/replicas"),
        ("rbac.scope=everywhere", "/rbac/scope"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("monitoring.podMonitor.interval=soon", "/monitoring/podMonitor/interval"),
        ("operator.livenessPort=80", "/operator/livenessPort"),
        ("operatr.replicas=1", "additional properties"),
    ],
)
def test_values_schema_rejects_bad_values(flag: str, message: str) -> None:
    res = run_helm(*template_args(extra=["--set", flag]))
    assert res.returncode != 0, f"--set {flag} rendered"
    assert message in res.stderr, res.stderr


def test_values_schema_documents_every_value() -> None:
    """Every key of values.yaml is in the schema (and every schema property has a
    description), and every key in values.yaml has a comment right above it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"].startswith("http://json-schema.org/draft-07/")
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], sch: dict[str, Any], path: str) -> None:
        assert sch.get("additionalProperties") is False, f"{path or '/'} is open"
        for key, val in node.items():
            sub = sch["properties"].get(key)
            assert sub is not None, f"{path}/{key} missing from values.schema.json"
            assert sub.get("description"), f"{path}/{key} has no description in the schema"
            nested = sub.get("properties")
            if isinstance(val, dict) and nested is not None and key not in ("resources",):
                walk(val, sub, f"{path}/{key}")

    walk(values, schema, "")

    # A comment line right above every value. Paths come from indentation; maps given as
    # a default (resources, labels) are data below a documented value, not values.
    data_maps = {"operator.resources"}
    stack: list[tuple[int, str]] = []
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z_]\w*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parents = [k for _, k in stack]
        stack.append((indent, m.group(2)))
        sch = schema
        documented = True
        for k in parents:
            sch = sch.get("properties", {}).get(k, {})
            if ".".join(parents[: parents.index(k) + 1]) in data_maps or "properties" not in sch:
                documented = False
                break
        if documented:
            assert lines[i - 1].strip().startswith("#"), f"values.yaml:{i + 1} has no comment"


# ---- CRD drift -----------------------------------------------------------------------------


def test_chart_crd_is_byte_identical_to_the_repo_crd() -> None:
    ours = CHART / "crds" / "genpool.dev_genpools.yaml"
    theirs = REPO / "crds" / "genpool.dev_genpools.yaml"
    assert theirs.exists(), "crds/genpool.dev_genpools.yaml is missing"
    assert ours.read_bytes() == theirs.read_bytes(), (
        "charts/genpool/crds/genpool.dev_genpools.yaml drifted from crds/: run charts/sync-crd.sh"
    )


# ---- operator workload ---------------------------------------------------------------------


def test_default_operator_deployment(tmp_path: Path) -> None:
    objs = render({}, tmp_path)
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    # Never two unpeered operators at once, not even during a rollout.
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]
    c = container(objs)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert c["image"] == f"genpool/operator:{chart['appVersion']}"
    assert chart["appVersion"] == "0.1.0" and chart["apiVersion"] == "v2"
    assert c["command"] == ["genpool-operator"]
    assert c["args"] == ["--liveness-port=8080", "--all-namespaces"]
    probe = c["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": 8080}
    assert {"name": "healthz", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
    env = env_of(c)
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["GENPOOL_WORKER_IMAGE"]["value"] == f"genpool/worker:{chart['appVersion']}"
    assert env["GENPOOL_ADMIN_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": f"{RELEASE}-admin-token", "key": "token"}
    }
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert "GENPOOL_OPERATOR_PRIORITY" not in env


def test_operator_values_reach_the_pod(tmp_path: Path) -> None:
    values = {
        "image": {
            "repository": "mirror.local/genpool/operator",
            "tag": "dev",
            "pullPolicy": "Always",
        },
        "worker": {"image": "mirror.local/genpool/worker:dev"},
        "operator": {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}, "verbose": True},
        "imagePullSecrets": [{"name": "pull"}],
    }
    objs = render(values, tmp_path)
    c = container(objs)
    assert c["image"] == "mirror.local/genpool/operator:dev"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
    assert c["args"][-1] == "--verbose"
    assert env_of(c)["GENPOOL_WORKER_IMAGE"]["value"] == "mirror.local/genpool/worker:dev"
    assert workload(objs)["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "pull"}]


def test_every_pod_is_locked_down(case: tuple[str, Objs]) -> None:
    name, objs = case
    pods = [
        o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")
    ]
    pods += [o["spec"] for o in of_kind(objs, "Pod")]
    assert pods, name
    for pod in pods:
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001, name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc.get("privileged", False) is False, name
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001, name
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert "emptyDir" in volumes[mounts["/tmp"]], name


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


# ---- admin token ---------------------------------------------------------------------------


def test_generated_admin_token(tmp_path: Path) -> None:
    objs = render({}, tmp_path)
    secret = one(objs, "Secret")
    assert secret["metadata"]["name"] == f"{RELEASE}-admin-token"
    assert set(secret["data"]) == {"token"}
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{40}", token)
    # Without a cluster to look the Secret up in, each render draws a new token.
    again = one(render({}, tmp_path), "Secret")["data"]["token"]
    assert again != secret["data"]["token"]


def test_existing_admin_secret(tmp_path: Path) -> None:
    objs = render(
        {"adminToken": {"existingSecret": "my-admin", "existingSecretKey": "tok"}}, tmp_path
    )
    assert not of_kind(objs, "Secret")
    ref = env_of(container(objs))["GENPOOL_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "my-admin", "key": "tok"}


# ---- monitoring ----------------------------------------------------------------------------


def test_monitors_are_off_by_default(tmp_path: Path) -> None:
    objs = render({}, tmp_path)
    assert not [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert not of_kind(objs, "ConfigMap")


@pytest.mark.parametrize("scope", ["cluster", "namespaced"])
def test_monitors_scrape_the_workers(scope: str, tmp_path: Path) -> None:
    values = {
        "rbac": {"scope": scope, "watchNamespaces": ["pools"]},
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}, "interval": "15s"},
            "podMonitor": {"enabled": True},
        },
    }
    objs = render(values, tmp_path)
    selector = {"matchLabels": {"app.kubernetes.io/name": "genpool-worker"}}
    expected_ns = {"any": True} if scope == "cluster" else {"matchNames": ["pools"]}
    sm = one(objs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["selector"] == selector
    assert sm["spec"]["namespaceSelector"] == expected_ns
    (ep,) = sm["spec"]["endpoints"]
    assert (ep["port"], ep["path"], ep["interval"]) == ("http", "/metrics", "15s")
    # The headless Service has the same labels: scraping it too would double every series.
    assert {
        "sourceLabels": ["__meta_kubernetes_service_name"],
        "regex": ".+-worker-headless",
        "action": "drop",
    } in ep["relabelings"]
    pm = one(objs, "PodMonitor")
    assert pm["spec"]["selector"] == selector
    assert pm["spec"]["namespaceSelector"] == expected_ns
    (pep,) = pm["spec"]["podMetricsEndpoints"]
    assert (pep["port"], pep["path"]) == ("http", "/metrics")
    for endpoint in (ep, pep):
        assert any(r.get("targetLabel") == "pool" for r in endpoint["relabelings"])


METRIC_NAME = re.compile(r"\bgenpool_[a-z_]+")


def exported_metrics() -> set[str]:
    """Series names the worker exports: counters gain _total, histograms _bucket/_sum/_count."""
    src = (REPO / "worker" / "genpool_worker" / "metrics.py").read_text()
    names: set[str] = set()
    for m in re.finditer(
        r'(Gauge|Counter)MetricFamily\(\s*"(genpool_\w+)"|counter\(\s*"(genpool_\w+)"|'
        r'gauge\(\s*"(genpool_\w+)"|Histogram\(\s*"(genpool_\w+)"',
        src,
    ):
        kind, fam, ctr, gauge, hist = m.groups()
        if kind == "Counter" or ctr:
            names.add(f"{fam or ctr}_total")
        elif kind == "Gauge" or gauge:
            names.add(fam or gauge)
        else:
            names.update(f"{hist}_{s}" for s in ("bucket", "sum", "count"))
    return names


def test_grafana_dashboard(tmp_path: Path) -> None:
    objs = render({"grafanaDashboard": {"enabled": True, "namespace": "grafana"}}, tmp_path)
    cm = one(objs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "grafana"
    dash = json.loads(cm["data"]["genpool.json"])
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("quantile", "below-target", "credit", "paused", "cap", "headroom", "victims"):
        assert topic in titles, f"no panel about {topic}"
    exported = exported_metrics()
    assert "genpool_step_seconds_bucket" in exported and "genpool_paused" in exported
    used = {n for e in exprs for n in METRIC_NAME.findall(e)}
    assert used and used <= exported, f"dashboard uses unknown series {used - exported}"
    assert any("histogram_quantile" in e for e in exprs)
    for p in dash["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}"
            assert "$pool" in t["expr"]
