"""Prefill/decode disaggregation (``spec.prefill``, docs/pd.md) under the operator, on the
local control plane with real synthetic-model workers: both StatefulSets with their roles,
``status.prefill`` and the Prefill column, the decode workers told the ready prefill pods
(``GET /prefillers``), a request whose prefill leg runs on the prefill tier, the tier
scaled and then removed, and an invalid P/D spec refused by the apiserver. The CEL rules
themselves run for every case of tests/invalid_genpools.py in test_operator.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client

from genpool_core.names import WORKER_PORT
from tests.conftest import Kubectl
from tests.integration.operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    create_pool,
    genpool,
    get_pool,
    ready_pods,
    synthetic_spec,
)
from tests.polling import wait_for

EXAMPLE = Path(__file__).parents[2] / "examples" / "genpool-pd.yaml"
POOL = "pd"
ROLE_LABEL = "llm-d.ai/role"
PD_SELECTOR = f"genpool.dev/pool={POOL},{ROLE_LABEL}!=prefill"


def _status(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = get_pool(api, namespace, POOL).get("status") or {}
    return status


def _ready_by_role(api: client.ApiClient, namespace: str) -> dict[str, list[client.V1Pod]]:
    tiers: dict[str, list[client.V1Pod]] = {}
    for pod in ready_pods(api, namespace, POOL):
        tiers.setdefault((pod.metadata.labels or {}).get(ROLE_LABEL, "none"), []).append(pod)
    return tiers


def _prefillers(pod: client.V1Pod) -> list[str]:
    response = httpx.get(f"http://{pod.status.pod_ip}:{WORKER_PORT}/prefillers", timeout=5)
    response.raise_for_status()
    endpoints: list[str] = response.json()["endpoints"]
    return sorted(endpoints)


def _exports_ok(pod: client.V1Pod) -> float:
    """``genpool_kv_transfers_total{side="export", outcome="ok"}`` of a prefill worker."""
    text = httpx.get(f"http://{pod.status.pod_ip}:{WORKER_PORT}/metrics", timeout=5).text
    series = re.compile(r"^genpool_kv_transfers_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
    total = 0.0
    for line in text.splitlines():
        found = series.match(line)
        if found and {'side="export"', 'outcome="ok"'} <= set(found["labels"].split(",")):
            total += float(found["value"])
    return total


def _printer_columns(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """``kubectl get gp`` parsed by the header's column positions (a cell may be empty)."""
    header, row = kubectl("get", "gp", POOL, "-n", namespace).stdout.splitlines()[:2]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], max(len(header), len(row)) + 1]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def _patch(api: client.ApiClient, namespace: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, POOL, {"spec": spec}
    )


def _check_the_statefulsets(apps: client.AppsV1Api, namespace: str) -> None:
    gen = apps.read_namespaced_stateful_set(f"{POOL}-worker", namespace)
    prefill = apps.read_namespaced_stateful_set(f"{POOL}-prefill", namespace)
    for sts, role in ((gen, "decode"), (prefill, "prefill")):
        (container,) = sts.spec.template.spec.containers
        assert container.args[-1] == f"--role={role}", container.args
        assert sts.spec.template.metadata.labels[ROLE_LABEL] == role
    assert prefill.metadata.labels[ROLE_LABEL] == "prefill"
    assert [o.kind for o in prefill.metadata.owner_references] == ["GenPool"]


def _tier_ready(api: client.ApiClient, namespace: str, count: int) -> dict[str, Any]:
    """status.prefill once ``count`` prefill pods are ready and every decode worker knows."""
    tiers = wait_for(
        lambda: (
            (t := _ready_by_role(api, namespace))
            and len(t.get("prefill", [])) == count
            and len(t.get("decode", [])) == 1
            and t
        ),
        timeout=120,
        what=f"1 decode and {count} prefill pods ready",
    )
    wanted = sorted(f"{p.status.pod_ip}:{WORKER_PORT}" for p in tiers["prefill"])
    (decode,) = tiers["decode"]
    wait_for(lambda: _prefillers(decode) == wanted, timeout=30, what=f"prefillers {wanted}")
    status = wait_for(
        lambda: (
            (s := _status(api, namespace).get("prefill") or {})
            and s.get("endpoints") == wanted
            and s.get("ready") == f"{count}/{count}"
            and s.get("decodeInSync") == "1/1"
            and s
        ),
        timeout=30,
        what=f"status.prefill with {count} ready and the endpoints told",
    )
    return {"status": status, "decode": decode, "prefill": tiers["prefill"]}


def _drop_the_tier(api: client.ApiClient, kubectl: Kubectl, namespace: str) -> None:
    """No prefill tier: its StatefulSet, pods and status go; the GEN pods run --role both."""
    apps = client.AppsV1Api(api)
    _patch(api, namespace, {"prefill": None})
    wait_for(
        lambda: (
            not apps.list_namespaced_stateful_set(
                namespace, field_selector=f"metadata.name={POOL}-prefill"
            ).items
        ),
        timeout=60,
        what="the prefill StatefulSet deleted",
    )
    status = wait_for(
        lambda: (s := _status(api, namespace)) and "prefill" not in s and s,
        timeout=30,
        what="status.prefill dropped",
    )
    assert status["selector"] == f"genpool.dev/pool={POOL}"
    (container,) = apps.read_namespaced_stateful_set(
        f"{POOL}-worker", namespace
    ).spec.template.spec.containers
    assert not any(arg.startswith("--role") for arg in container.args)
    wait_for(
        lambda: list(_ready_by_role(api, namespace)) == ["none"],
        timeout=120,
        what="only GEN pods without a role, ready",
    )
    assert _printer_columns(kubectl, namespace)["PREFILL"] in ("", "<none>")


def test_a_pd_pool_runs_both_tiers_tells_the_decode_workers_and_drops_the_tier(
    kube_api: client.ApiClient, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    create_pool(kube_api, namespace, genpool(POOL, synthetic_spec(prefill={"replicas": 1})))
    apps = client.AppsV1Api(kube_api)
    wait_for(
        lambda: apps.read_namespaced_stateful_set(f"{POOL}-prefill", namespace),
        what="the prefill StatefulSet",
    )
    _check_the_statefulsets(apps, namespace)
    one = _tier_ready(kube_api, namespace, 1)
    assert one["status"]["desired"] == 1 and one["status"]["readyReplicas"] == 1
    # The GEN tier's Ready comes from its own StatefulSet's mirror, a moment apart.
    status = wait_for(
        lambda: (s := _status(kube_api, namespace)).get("ready") == "1/1" and s,
        timeout=30,
        what="the GEN tier ready",
    )
    assert status["selector"] == PD_SELECTOR
    assert _printer_columns(kubectl, namespace)["PREFILL"] == "1/1"

    # A request to the decode worker: its prefill leg runs on the prefill tier.
    body = {"model": "synthetic:tiny", "prompt": "split me", "max_tokens": 4}
    url = f"http://{one['decode'].status.pod_ip}:{WORKER_PORT}/v1/completions"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 200, response.text
    (prefill_pod,) = one["prefill"]
    assert _exports_ok(prefill_pod) >= 1

    # More prefill pods: the decode worker learns the new one.
    _patch(kube_api, namespace, {"prefill": {"replicas": 2}})
    _tier_ready(kube_api, namespace, 2)

    _drop_the_tier(kube_api, kubectl, namespace)


def test_kubectl_apply_of_an_invalid_pd_pool_names_the_field(
    kubectl: Kubectl, crd: None, namespace: str
) -> None:
    bad = [
        ({"tensorParallelSize": 2}, "spec.prefill needs spec.tensorParallelSize 1"),
        ({"prefill": {"replicas": -1}}, "spec.prefill.replicas"),
        ({"prefill": {"model": "smollm2-135m"}}, "spec.prefill.model must be spec.model"),
        ({"prefill": {"engine": {"kvBlockSize": 8}}}, 'unknown field "spec.prefill.engine"'),
    ]
    for change, error in bad:
        spec = synthetic_spec(prefill={"replicas": 1}) | change
        manifest = json.dumps(genpool("bad-pd", spec))
        result = kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=False)
        assert result.returncode != 0 and error in result.stderr, (change, result.stderr)
    assert not kubectl("get", "gp", "-n", namespace, "-o", "name").stdout.strip()


def test_the_pd_example_starts_and_serves_through_both_tiers(
    kube_api: client.ApiClient, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    # examples/genpool-pd.yaml as it is: SmolLM2-135M on CPU, one worker a tier.
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    status = wait_for(
        lambda: (
            (s := get_pool(kube_api, namespace, name).get("status") or {})
            and s.get("ready") == "1/1"
            and (s.get("prefill") or {}).get("ready") == "1/1"
            and (s.get("prefill") or {}).get("decodeInSync") == "1/1"
            # A round can run before the prefill pod is ready (endpoints [], in sync) and the
            # StatefulSet's mirror report it ready after: wait for the round that found it.
            and len((s.get("prefill") or {}).get("endpoints") or ()) == 1
            and s
        ),
        timeout=240,
        what="both tiers of the example ready and the decode worker told",
    )
    pods = {p.metadata.labels[ROLE_LABEL]: p for p in ready_pods(kube_api, namespace, name)}
    assert status["prefill"]["endpoints"] == [f"{pods['prefill'].status.pod_ip}:{WORKER_PORT}"]
    body = {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 8}
    url = f"http://{pods['decode'].status.pod_ip}:{WORKER_PORT}/v1/completions"
    response = httpx.post(url, json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert _exports_ok(pods["prefill"]) >= 1
