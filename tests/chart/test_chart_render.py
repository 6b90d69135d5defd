"""The Helm chart, rendered offline: lint, schema validation of every built-in object,
pod security, monitors, the admin token and CRD drift (RBAC and peering: test_chart_rbac)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from genpool_core.names import OPERATOR_METRICS_PORT

from .conftest import (
    CASES,
    CHART,
    RELEASE,
    REPO,
    Objs,
    container,
    env_of,
    of_kind,
    one,
    render,
    run_helm,
    template_args,
    workload,
)

# Groups whose kinds kubernetes-validate has no schema for (CRD-defined); the apiserver
# dry-run in test_chart_cluster.py covers what it can of them.
CUSTOM_GROUPS = {"monitoring.coreos.com", "kopf.dev", "genpool.dev"}

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
    assert c["args"] == ["--liveness-port=8080", "--metrics-port=8081", "--all-namespaces"]
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


def test_the_operator_serves_metrics_and_its_monitor_scrapes_them(tmp_path: Path) -> None:
    c = container(render({}, tmp_path))
    assert f"--metrics-port={OPERATOR_METRICS_PORT}" in c["args"]
    port = {"name": "metrics", "containerPort": OPERATOR_METRICS_PORT, "protocol": "TCP"}
    assert port in c["ports"]
    objs = render({"monitoring": {"operatorPodMonitor": {"enabled": True}}}, tmp_path)
    (monitor,) = [
        o for o in of_kind(objs, "PodMonitor") if o["metadata"]["name"].endswith("-operator")
    ]
    labels = workload(objs)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    off = container(render({"operator": {"metricsPort": 0}}, tmp_path))
    assert "--metrics-port=0" in off["args"] and all(p["name"] != "metrics" for p in off["ports"])
    failed = run_helm(
        *template_args(),
        values={
            "operator": {"metricsPort": 0},
            "monitoring": {"operatorPodMonitor": {"enabled": True}},
        },
        tmp_path=tmp_path,
    )
    assert failed.returncode != 0 and "needs operator.metricsPort" in failed.stderr
