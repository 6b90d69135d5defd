"""The InferencePool CRD on the devcluster, and reading what the operator made of
spec.inferencePool (tests/integration/test_inference_pool.py, test_endpoint_picker.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from genpool_core.names import INFERENCE_POOL_GROUP, INFERENCE_POOL_PLURAL
from genpool_operator.inference_pool import CRD_NAME, INFERENCE_POOL_CONDITION
from tests.conftest import Kubectl
from tests.integration.operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    get_pool,
    synthetic_spec,
)
from tests.polling import wait_for

# GIE v1.2.0's CRD, vendored with its sha256 (tests/data/crds/README.md).
INFERENCE_POOL_CRD = (
    Path(__file__).parents[1] / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
)
# The endpoint picker also watches InferenceObjectives: it does not start unless they are served.
INFERENCE_OBJECTIVE_CRD = INFERENCE_POOL_CRD.with_name(
    "inference.networking.x-k8s.io_inferenceobjectives.yaml"
)
INFERENCE_OBJECTIVE_CRD_NAME = "inferenceobjectives.inference.networking.x-k8s.io"
IP_VERSION = "v1"
PICKER = {"name": "chat-epp", "port": 9002}


def routed_spec(replicas: int = 1, **picker: Any) -> dict[str, Any]:
    ref = {**PICKER, **picker}
    return synthetic_spec(
        replicas=replicas, inferencePool={"enabled": True, "endpointPickerRef": ref}
    )


def _served(kube_api: client.ApiClient) -> bool:
    groups = client.ApisApi(kube_api).get_api_versions().groups
    return any(g.name == INFERENCE_POOL_GROUP for g in groups)


def remove_inference_pool_crd(kubectl: Kubectl, kube_api: client.ApiClient) -> None:
    kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")
    wait_for(lambda: not _served(kube_api), timeout=60, what=f"{CRD_NAME} no longer served")


def install_inference_pool_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "-f", str(INFERENCE_POOL_CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")


def install_inference_objective_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "-f", str(INFERENCE_OBJECTIVE_CRD))
    wait = ("wait", "--for=condition=Established", "--timeout=60s")
    kubectl(*wait, f"crd/{INFERENCE_OBJECTIVE_CRD_NAME}")


def remove_inference_objective_crd(kubectl: Kubectl) -> None:
    kubectl("delete", "crd", INFERENCE_OBJECTIVE_CRD_NAME, "--ignore-not-found", "--wait=true")


def objects(kube_api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api)


def get_inference_pool(kube_api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = objects(kube_api).get_namespaced_custom_object(
        INFERENCE_POOL_GROUP, IP_VERSION, namespace, INFERENCE_POOL_PLURAL, name
    )
    return found


def is_gone(kube_api: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        get_inference_pool(kube_api, namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def pool_condition(kube_api: client.ApiClient, namespace: str, pool: str) -> dict[str, Any] | None:
    conditions = get_pool(kube_api, namespace, pool).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == INFERENCE_POOL_CONDITION), None)


def patch_pool(kube_api: client.ApiClient, namespace: str, pool: str, spec: Any) -> None:
    objects(kube_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, pool, {"spec": spec}
    )
