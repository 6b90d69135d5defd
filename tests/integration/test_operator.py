"""The operator against a real kube-apiserver + controller-manager + pod runner.

Worker pods run the real ``genpool-worker`` with a synthetic model, so the HTTP,
``PUT /config`` and stat-line paths are the production ones.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from genpool_core.names import CONFIG_HASH_ANNOTATION, WORKER_PORT, pool_label_selector
from genpool_operator.kube import Kube, load_config
from genpool_operator.status import update_status
from tests.conftest import DevCluster, Kubectl
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
from tests.invalid_genpools import INVALID_GENPOOLS
from tests.polling import wait_for

CHILD_KINDS = ("statefulsets", "services", "configmaps", "poddisruptionbudgets", "secrets")


def _children(kubectl: Kubectl, namespace: str, pool: str) -> dict[str, list[dict[str, Any]]]:
    found = {}
    for kind in CHILD_KINDS:
        out = kubectl("get", kind, "-n", namespace, "-l", pool_label_selector(pool), "-o", "json")
        found[kind] = json.loads(out.stdout)["items"]
    return found


def test_crd_installs_with_useful_explain(kubectl: Kubectl, crd: None) -> None:
    # The OpenAPI document is published a moment after the CRD is Established.
    out = wait_for(
        lambda: (
            (r := kubectl("explain", "genpools.spec.preemption.mode", check=False))
            and r.returncode == 0
            and r.stdout
        ),
        timeout=60,
        what="kubectl explain",
    )
    assert "TargetOutputTps" in out or "target" in out.lower()
    out = " ".join(kubectl("explain", "gp.spec.tuning.pausedCap").stdout.split())
    assert "Bounds of the paused cap P" in out and "min" in out and "max" in out
    out = kubectl("explain", "gp.spec.modelVolume").stdout
    assert "mounted read-only at /models" in " ".join(out.split())
    out = " ".join(kubectl("explain", "gp.spec.engine.stampArrival").stdout.split())
    assert "<boolean>" in out and "x-genpool-arrival-time" in out and "unkeyed" in out
    out = " ".join(kubectl("explain", "gp.spec.autoscaling.targetUtilization").stdout.split())
    assert "<number>" in out and "Expert override" in out and "learns it" in out
    out = " ".join(kubectl("explain", "gp.spec.autoscaling.startupSeconds").stdout.split())
    assert "<integer>" in out and "horizon the scaler forecasts over" in out


@pytest.mark.parametrize("case", INVALID_GENPOOLS, ids=lambda c: c.name)
def test_invalid_genpool_is_rejected_with_a_clear_message(
    kube_api: client.ApiClient, crd: None, namespace: str, case: Any
) -> None:
    objs = client.CustomObjectsApi(kube_api)
    body = genpool(f"bad-{case.name}"[:60], case.spec)
    with pytest.raises(ApiException) as info:
        objs.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
        )
    assert info.value.status in (400, 422), info.value.body  # 400: strict decoding
    message = json.loads(info.value.body)["message"]
    assert case.api_error in message


EXAMPLES = Path(__file__).parents[2] / "examples"
VALID_MODEL_VOLUMES: dict[str, dict[str, Any]] = {
    "host-path-root": {"model": ".", "modelVolume": {"hostPath": {"path": "/data/llama"}}},
    "claim-sub-path": {
        "model": "llama/Llama-3.1-8B-Instruct",
        "modelVolume": {"persistentVolumeClaim": {"claimName": "ckpt"}, "subPath": "hub/meta"},
    },
    # the KV budget's forms (its CEL rule takes an int or a string)
    "kv-quantity": {"model": "smollm2-135m", "engine": {"kvCacheMemory": "1.5Gi"}},
    "kv-bytes": {"model": "smollm2-135m", "engine": {"kvCacheMemory": 8589934592}},
    "gpu-share": {"model": "smollm2-135m", "engine": {"gpuMemoryUtilization": 0.8}},
    **{
        path.stem: yaml.safe_load(path.read_text())["spec"]
        for path in sorted(EXAMPLES.glob("genpool-*.yaml"))
    },
}


@pytest.mark.parametrize("name", sorted(VALID_MODEL_VOLUMES))
def test_examples_and_model_volumes_pass_the_apiserver(
    kube_api: client.ApiClient, crd: None, namespace: str, name: str
) -> None:
    # A server-side dry run: the CEL rules accept what they should, nothing is stored.
    objs = client.CustomObjectsApi(kube_api)
    body = genpool(f"ok-{name}", VALID_MODEL_VOLUMES[name])
    created = objs.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict", dry_run="All"
    )
    assert created["spec"]["model"] == VALID_MODEL_VOLUMES[name]["model"]


def test_children_are_owned_and_garbage_collected(
    kube_api: client.ApiClient, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    created = create_pool(kube_api, namespace, genpool("gc", synthetic_spec()))
    uid = created["metadata"]["uid"]
    children = wait_for(
        lambda: (c := _children(kubectl, namespace, "gc")) and all(c.values()) and c,
        timeout=60,
        what="all children of gc",
    )
    assert len(children["services"]) == 2
    for items in children.values():
        for child in items:
            owners = child["metadata"]["ownerReferences"]
            assert [(o["kind"], o["uid"], o.get("controller")) for o in owners] == [
                ("GenPool", uid, True)
            ]
    pool = wait_for(
        lambda: get_pool(kube_api, namespace, "gc").get("status", {}).get("observedGeneration"),
        timeout=30,
        what="observedGeneration",
    )
    assert pool == 1
    client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "gc"
    )
    wait_for(
        lambda: not any(_children(kubectl, namespace, "gc").values()),
        timeout=90,
        what="garbage collection of gc's children",
    )


def _pod_config(pod: client.V1Pod) -> dict[str, Any]:
    response = httpx.get(f"http://{pod.status.pod_ip}:{WORKER_PORT}/config", timeout=5)
    response.raise_for_status()
    config: dict[str, Any] = response.json()
    return config


def test_live_field_reaches_pods_without_a_rollout(
    kube_api: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create_pool(kube_api, namespace, genpool("live", synthetic_spec(replicas=2)))
    pods = wait_for(
        lambda: len(p := ready_pods(kube_api, namespace, "live")) == 2 and p,
        timeout=120,
        what="2 ready worker pods",
    )
    apps = client.AppsV1Api(kube_api)
    sts_before = apps.read_namespaced_stateful_set("live-worker", namespace)
    uids = sorted(p.metadata.uid for p in pods)
    wait_for(
        lambda: all(_pod_config(p)["generation"] >= 1 for p in pods),
        timeout=30,
        what="first config push",
    )
    patch = {"spec": {"preemption": {"slackSeconds": 0.9}}}
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "live", patch
    )
    wait_for(
        lambda: all(abs(_pod_config(p)["slack_s"] - 0.9) < 1e-9 for p in pods),
        timeout=30,
        what="slack_s 0.9 on every pod",
    )
    sts_after = apps.read_namespaced_stateful_set("live-worker", namespace)
    assert sts_after.metadata.generation == sts_before.metadata.generation
    assert sorted(p.metadata.uid for p in ready_pods(kube_api, namespace, "live")) == uids
    status = wait_for(
        lambda: (
            (s := get_pool(kube_api, namespace, "live").get("status", {}))
            and s.get("tuning", {}).get("podsInSync") == "2/2"
            and s.get("workersReporting") == 2
            and s
        ),
        timeout=30,
        what="podsInSync 2/2 and 2 workers reporting",
    )
    assert status["ready"] == "2/2"
    # The pool's cap is the workers' sum, each within the tuner's bounds (0..A, A = B = 8).
    cap = status["preemption"]["cap"]
    assert isinstance(cap, int) and 0 <= cap <= 2 * 8, status["preemption"]


def test_status_write_retries_a_real_conflict(
    cluster: DevCluster,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
) -> None:
    create_pool(kube_api, namespace, genpool("conflict", synthetic_spec(replicas=0)))
    objs = client.CustomObjectsApi(kube_api)
    calls: list[int] = []

    def mutate(status: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:  # someone else writes between our read and our write
            objs.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                "conflict",
                {"metadata": {"annotations": {"touched": "yes"}}},
            )
        return {"phase": "Idle"}

    async def scenario() -> None:
        kube = Kube(load_config(str(cluster.kubeconfig)))
        try:
            await update_status(kube, namespace, "conflict", mutate)
        finally:
            await kube.aclose()

    asyncio.run(scenario())
    assert len(calls) == 2  # the first write got 409 and was retried from a fresh read
    assert get_pool(kube_api, namespace, "conflict")["status"]["phase"] == "Idle"


def test_a_status_write_gathers_its_facts_after_each_read(
    cluster: DevCluster,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
) -> None:
    """The Degraded race (reconcile vs pod watch): facts gathered before the read could
    overwrite a newer finding written in between. ``after_read`` gathers them after each
    read, so the write that lands carries the facts of its own, latest read."""
    create_pool(kube_api, namespace, genpool("facts", synthetic_spec(replicas=0)))
    objs = client.CustomObjectsApi(kube_api)
    gathered: list[int] = []

    async def gather() -> None:
        gathered.append(len(gathered) + 1)
        if len(gathered) == 1:  # another writer lands between our read and our write
            objs.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "facts", {"status": {"phase": "Other"}}
            )

    def mutate(status: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        return {"phase": f"facts-{gathered[-1]}"}

    async def scenario() -> None:
        kube = Kube(load_config(str(cluster.kubeconfig)))
        try:
            await update_status(kube, namespace, "facts", mutate, after_read=gather)
        finally:
            await kube.aclose()

    asyncio.run(scenario())
    assert gathered == [1, 2]  # the first write got 409: read again, gathered again
    assert get_pool(kube_api, namespace, "facts")["status"]["phase"] == "facts-2"


def test_restart_mid_reconcile_creates_no_duplicates(
    kube_api: client.ApiClient, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    create_pool(kube_api, namespace, genpool("restart", synthetic_spec(replicas=2)))
    wait_for(
        lambda: any(_children(kubectl, namespace, "restart").values()),
        timeout=60,
        what="the first child",
        interval=0.05,
    )
    operator.kill()
    operator.start()
    children = wait_for(
        lambda: (c := _children(kubectl, namespace, "restart")) and all(c.values()) and c,
        timeout=60,
        what="all children after the restart",
    )
    counts = {kind: len(items) for kind, items in children.items()}
    assert counts == {
        "statefulsets": 1,
        "services": 2,
        "configmaps": 1,
        "poddisruptionbudgets": 1,
        "secrets": 2,  # the admin token's copy and the pool's KV secret
    }
    pods = wait_for(
        lambda: len(p := ready_pods(kube_api, namespace, "restart")) == 2 and p,
        timeout=120,
        what="2 ready pods",
    )
    assert sorted(p.metadata.name for p in pods) == ["restart-worker-0", "restart-worker-1"]


def test_template_field_rolls_the_statefulset(
    kube_api: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create_pool(kube_api, namespace, genpool("roll", synthetic_spec(replicas=0)))
    apps = client.AppsV1Api(kube_api)

    def config_hash() -> str | None:
        sts = apps.read_namespaced_stateful_set("roll-worker", namespace)
        return (sts.spec.template.metadata.annotations or {}).get(CONFIG_HASH_ANNOTATION)

    before = wait_for(config_hash, timeout=60, what="the StatefulSet")
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "roll", {"spec": {"engine": {"maxBatchSize": 6}}}
    )
    after = wait_for(
        lambda: (h := config_hash()) != before and h, timeout=30, what="a new config hash"
    )
    assert after != before
    data = client.CoreV1Api(kube_api).read_namespaced_config_map("roll-worker-config", namespace)
    assert json.loads(data.data["worker.json"])["max_batch_size"] == 6


def test_stats_from_pod_logs(
    kube_api: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    spec = synthetic_spec(tuning={"intervalSeconds": 2, "statsSource": "Log"})
    create_pool(kube_api, namespace, genpool("logs", spec))
    status = wait_for(
        lambda: (
            (s := get_pool(kube_api, namespace, "logs").get("status", {}))
            and s.get("workersReporting") == 1
            and s.get("statsUpdatedAt")
            and s
        ),
        timeout=120,
        what="stats read from the worker's log through the API",
    )
    stale = {c["type"]: c["status"] for c in status["conditions"]}["StatsStale"]
    cap = status["preemption"]["cap"]  # one worker's, within the tuner's bounds (0..A = 8)
    assert stale == "False" and isinstance(cap, int) and 0 <= cap <= 8, status["preemption"]
