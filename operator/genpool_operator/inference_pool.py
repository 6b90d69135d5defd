"""The pool's InferencePool (Gateway API Inference Extension) and its condition; pure.

With ``spec.inferencePool.enabled`` the operator writes an ``InferencePool``
(inference.networking.k8s.io/v1) named after the GenPool. It selects the worker pods by
the pool label and targets the worker port, so a gateway's HTTPRoute can send requests
to it and the endpoint picker it names chooses a worker per request from the workers'
``/metrics`` gauges. Like every child it is owned by the GenPool and garbage-collected
with it.

The InferencePool CRD is someone else's (GIE's release manifests install it). When the
apiserver does not serve it, the operator writes nothing and says so in the condition
``InferencePoolReady``; the rest of the pool is unaffected.
"""

from __future__ import annotations

from typing import Any

from genpool_core.names import (
    INFERENCE_POOL_API_VERSION,
    INFERENCE_POOL_GROUP,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_PLURAL,
    WORKER_PORT,
    pool_label_selector,
)
from genpool_operator.builders import PoolRef, owner_reference, pool_labels, pool_selector
from genpool_operator.conditions import Condition
from genpool_operator.spec_sections import EndpointPickerRef, InferencePool

INFERENCE_POOL_CONDITION = "InferencePoolReady"
CRD_NAME = f"{INFERENCE_POOL_PLURAL}.{INFERENCE_POOL_GROUP}"


def inference_pool_name(pool: str) -> str:
    # The GenPool's own name: what an HTTPRoute's backendRef and the picker's --pool-name use.
    return pool


def build_inference_pool(pool: PoolRef, settings: InferencePool) -> dict[str, Any]:
    """The InferencePool of an enabled ``spec.inferencePool`` (its picker ref is required)."""
    picker = settings.endpoint_picker_ref
    if picker is None:
        raise ValueError("spec.inferencePool.endpointPickerRef is required when enabled")
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": INFERENCE_POOL_KIND,
        "metadata": {
            "name": inference_pool_name(pool.name),
            "namespace": pool.namespace,
            "labels": pool_labels(pool.name),
            "ownerReferences": [owner_reference(pool)],
        },
        "spec": {
            "selector": {"matchLabels": pool_selector(pool.name)},
            "targetPorts": [{"number": WORKER_PORT}],
            "endpointPickerRef": {
                # The CRD's defaults, spelled out: what is applied is what is read back.
                "group": "",
                "kind": "Service",
                "name": picker.name,
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode,
            },
        },
    }


def is_owned_by(obj: dict[str, Any], pool: PoolRef) -> bool:
    """Whether ``obj`` is this GenPool's (never delete an InferencePool a user wrote)."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == pool.uid for ref in refs)


def applied(pool: PoolRef, picker: EndpointPickerRef) -> Condition:
    return Condition(
        INFERENCE_POOL_CONDITION,
        True,
        "Applied",
        f"InferencePool {inference_pool_name(pool.name)} selects pods "
        f"{pool_label_selector(pool.name)} on port {WORKER_PORT}; endpoint picker "
        f"Service {picker.name}:{picker.port} ({picker.failure_mode})",
    )


def crd_not_installed() -> Condition:
    return Condition(
        INFERENCE_POOL_CONDITION,
        False,
        "CRDNotInstalled",
        f"the apiserver does not serve {INFERENCE_POOL_API_VERSION} {INFERENCE_POOL_KIND} "
        f"(CRD {CRD_NAME}): install the Gateway API Inference Extension v1.0.0 or later "
        "(docs/operator.md, Routing with the Gateway API Inference Extension), then change "
        "the GenPool or restart the operator to retry",
    )


def not_owned(pool: PoolRef) -> Condition:
    # Applying would make the GenPool its owner, and its garbage collection would delete it.
    name = inference_pool_name(pool.name)
    return Condition(
        INFERENCE_POOL_CONDITION,
        False,
        "NotOwned",
        f"InferencePool {name} exists and is not this GenPool's; the operator leaves it as it "
        "is: delete it (or rename the GenPool) for the operator to write its own",
    )


def rejected(status: int, message: str) -> Condition:
    """The apiserver refused the InferencePool (RBAC, validation): nothing else is wrong."""
    reason = "Forbidden" if status == 403 else "Rejected"
    return Condition(INFERENCE_POOL_CONDITION, False, reason, f"{status}: {message}")
