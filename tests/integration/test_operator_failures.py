"""Failures reach the GenPool's status without ``kubectl logs``: a worker that exits at
start sets Degraded=True with its termination message, and back to False once the pods
run again; a tensorParallelSize that cannot shard a known model is InvalidSpec."""

from __future__ import annotations

from typing import Any

from kubernetes import client

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

MISSING_MODEL = "no-such-model.gguf"  # unknown to the operator: the worker refuses it


def _condition(api: client.ApiClient, namespace: str, name: str, kind: str) -> dict[str, Any]:
    status = get_pool(api, namespace, name).get("status") or {}
    conditions = status.get("conditions") or []
    found = next((c for c in conditions if c["type"] == kind), {})
    return {**found, "phase": status.get("phase")}


def _degraded(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return _condition(api, namespace, name, "Degraded")


def test_a_worker_failing_at_start_degrades_the_pool_with_its_message(
    kube_api: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create_pool(kube_api, namespace, genpool("broken", synthetic_spec(model=MISSING_MODEL)))
    degraded = wait_for(
        lambda: (d := _degraded(kube_api, namespace, "broken")).get("status") == "True" and d,
        timeout=120,
        what="Degraded=True from the crash-looping worker",
    )
    assert degraded["reason"] == "WorkerCrashLoop"
    assert degraded["message"] == (
        f"pod broken-worker-0: GGUFLoadError: GGUF file not found: {MISSING_MODEL}"
    )
    assert degraded["phase"] == "Degraded"
    # Not "Progressing=True" forever: the rollout is stalled, and says why.
    progressing = _condition(kube_api, namespace, "broken", "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "WorkersFailing")

    fixed = {"spec": {"model": "synthetic:tiny"}}
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "broken", fixed
    )
    wait_for(lambda: ready_pods(kube_api, namespace, "broken"), timeout=120, what="a ready pod")
    healthy = wait_for(
        lambda: (d := _degraded(kube_api, namespace, "broken")).get("status") == "False" and d,
        timeout=60,
        what="Degraded=False once the worker runs",
    )
    assert healthy["reason"] == "SpecApplied"
    assert healthy["phase"] != "Degraded"


def test_tensor_parallel_size_that_cannot_shard_smollm2_is_an_invalid_spec(
    kube_api: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    spec = {**synthetic_spec(), "model": "smollm2-135m", "tensorParallelSize": 2}
    create_pool(kube_api, namespace, genpool("tp2", spec))
    degraded = wait_for(
        lambda: (d := _degraded(kube_api, namespace, "tp2")).get("status") == "True" and d,
        timeout=60,
        what="Degraded=True/InvalidSpec",
    )
    assert degraded["reason"] == "InvalidSpec"
    assert "spec.tensorParallelSize: 2 cannot shard smollm2-135m" in degraded["message"]
    assert "3 KV heads" in degraded["message"]
    assert degraded["phase"] == "Degraded"
    statefulsets = client.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace)
    assert statefulsets.items == []  # nothing started that could only crash-loop
