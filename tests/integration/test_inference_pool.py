"""spec.inferencePool against a real apiserver with the real InferencePool CRD.

The CRD is Gateway API Inference Extension v1.2.0's, vendored in tests/data/crds (its sha256
is checked by tests/unit/operator/test_inference_pool.py). The CRD is cluster-wide, so this
module removes it before the test that needs it absent and after its last test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from genpool_core.names import INFERENCE_POOL_GROUP, INFERENCE_POOL_PLURAL, WORKER_PORT
from genpool_operator.builders import PoolRef
from genpool_operator.inference_pool import CRD_NAME, build_inference_pool
from genpool_operator.spec import GenPoolSpec
from tests.conftest import Kubectl
from tests.integration.inference_pool_harness import (
    IP_VERSION,
    PICKER,
    get_inference_pool,
    install_inference_pool_crd,
    is_gone,
    objects,
    patch_pool,
    pool_condition,
    remove_inference_pool_crd,
    routed_spec,
)
from tests.integration.operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    create_pool,
    genpool,
    get_pool,
    ready_pods,
)
from tests.polling import wait_for


@pytest.fixture(scope="module")
def crd_cleanup(kubectl: Kubectl, kube_api: client.ApiClient) -> Iterator[None]:
    yield
    remove_inference_pool_crd(kubectl, kube_api)


@pytest.fixture
def no_inference_pool_crd(kubectl: Kubectl, kube_api: client.ApiClient, crd_cleanup: None) -> None:
    remove_inference_pool_crd(kubectl, kube_api)


@pytest.fixture
def inference_pool_crd(kubectl: Kubectl, crd_cleanup: None) -> None:
    install_inference_pool_crd(kubectl)


@pytest.mark.parametrize("failure_mode", ["FailOpen", "FailClose"])
def test_the_apiserver_accepts_the_built_inference_pool(
    kube_api: client.ApiClient, namespace: str, inference_pool_crd: None, failure_mode: str
) -> None:
    # Strict field validation and a server-side dry run: every field known, every CEL rule
    # (unique target ports, a port for a Service picker) holds, nothing is stored.
    spec = GenPoolSpec.from_body(routed_spec(failureMode=failure_mode))
    body = build_inference_pool(PoolRef("chat", namespace, "uid-1", 1), spec.inference_pool)
    del body["metadata"]["ownerReferences"]  # the owner does not exist
    created = objects(kube_api).create_namespaced_custom_object(
        INFERENCE_POOL_GROUP, IP_VERSION, namespace, INFERENCE_POOL_PLURAL, body,
        field_validation="Strict", dry_run="All",
    )  # fmt: skip
    assert created["spec"] == body["spec"]


def test_without_the_crd_a_condition_says_so_until_it_is_installed(
    kube_api: client.ApiClient,
    kubectl: Kubectl,
    namespace: str,
    no_inference_pool_crd: None,
    operator: OperatorProcess,
) -> None:
    create_pool(kube_api, namespace, genpool("routed", routed_spec()))
    condition = wait_for(
        lambda: pool_condition(kube_api, namespace, "routed"), timeout=60, what="InferencePoolReady"
    )
    assert (condition["status"], condition["reason"]) == ("False", "CRDNotInstalled")
    assert CRD_NAME in condition["message"]
    assert "install the Gateway API Inference Extension" in condition["message"]

    # The rest of the pool is unaffected. The reconcile records Degraded after it has applied
    # every child, InferencePool included, so it may land a write later.
    def degraded_condition() -> dict[str, Any] | None:
        conditions = get_pool(kube_api, namespace, "routed").get("status", {}).get("conditions")
        return next((c for c in conditions or [] if c["type"] == "Degraded"), None)

    degraded = wait_for(degraded_condition, timeout=60, what="the Degraded condition")
    assert degraded["status"] == "False"
    client.AppsV1Api(kube_api).read_namespaced_stateful_set("routed-worker", namespace)

    install_inference_pool_crd(kubectl)
    patch_pool(kube_api, namespace, "routed", {"inferencePool": {"endpointPickerRef": {
        **PICKER, "failureMode": "FailOpen"}}})  # fmt: skip
    condition = wait_for(
        lambda: (
            (c := pool_condition(kube_api, namespace, "routed")) and c["status"] == "True" and c
        ),
        timeout=60,
        what="InferencePoolReady True after the CRD is installed",
    )
    assert condition["reason"] == "Applied"
    picker = get_inference_pool(kube_api, namespace, "routed")["spec"]["endpointPickerRef"]
    assert picker["failureMode"] == "FailOpen"


def test_the_inference_pool_selects_the_workers_and_goes_with_the_pool(
    kube_api: client.ApiClient, namespace: str, inference_pool_crd: None, operator: OperatorProcess
) -> None:
    uid = create_pool(kube_api, namespace, genpool("chat", routed_spec(replicas=2)))["metadata"][
        "uid"
    ]
    pods = wait_for(
        lambda: len(p := ready_pods(kube_api, namespace, "chat")) == 2 and p,
        timeout=120,
        what="2 ready worker pods",
    )
    pool = wait_for(lambda: get_inference_pool(kube_api, namespace, "chat"), what="InferencePool")
    owners = pool["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in owners] == [
        ("GenPool", "chat", uid, True)
    ]
    # What an endpoint picker does: list the pods the selector matches, scrape each on the
    # target port.
    labels = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    selected = client.CoreV1Api(kube_api).list_namespaced_pod(namespace, label_selector=labels)
    assert sorted(p.metadata.name for p in selected.items) == sorted(p.metadata.name for p in pods)
    assert pool["spec"]["targetPorts"] == [{"number": WORKER_PORT}]
    for pod in pods:
        port = pool["spec"]["targetPorts"][0]["number"]
        response = httpx.get(f"http://{pod.status.pod_ip}:{port}/metrics", timeout=5)
        assert response.status_code == 200
        assert "genpool_" in response.text

    patch_pool(kube_api, namespace, "chat", {"inferencePool": {"enabled": False}})
    wait_for(lambda: is_gone(kube_api, namespace, "chat"), what="the InferencePool deleted")
    wait_for(
        lambda: pool_condition(kube_api, namespace, "chat") is None,
        what="InferencePoolReady dropped",
    )

    patch_pool(kube_api, namespace, "chat", {"inferencePool": {"enabled": True}})
    wait_for(lambda: get_inference_pool(kube_api, namespace, "chat"), what="InferencePool again")
    objects(kube_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "chat")
    wait_for(
        lambda: is_gone(kube_api, namespace, "chat"),
        timeout=90,
        what="garbage collection of the InferencePool",
    )


def test_an_inference_pool_someone_else_wrote_is_left_alone(
    kube_api: client.ApiClient, namespace: str, inference_pool_crd: None, operator: OperatorProcess
) -> None:
    # A user's InferencePool under the pool's name: applying would make the GenPool its owner,
    # and the GenPool's deletion would take it along.
    spec = GenPoolSpec.from_body(routed_spec())
    theirs = build_inference_pool(PoolRef("taken", namespace, "uid-1", 1), spec.inference_pool)
    del theirs["metadata"]["ownerReferences"]
    theirs["spec"]["targetPorts"] = [{"number": 9000}]
    objects(kube_api).create_namespaced_custom_object(
        INFERENCE_POOL_GROUP, IP_VERSION, namespace, INFERENCE_POOL_PLURAL, theirs
    )
    create_pool(kube_api, namespace, genpool("taken", routed_spec()))
    condition = wait_for(
        lambda: pool_condition(kube_api, namespace, "taken"), timeout=60, what="InferencePoolReady"
    )
    assert (condition["status"], condition["reason"]) == ("False", "NotOwned")
    kept = get_inference_pool(kube_api, namespace, "taken")
    assert "ownerReferences" not in kept["metadata"]
    assert kept["spec"]["targetPorts"] == [{"number": 9000}]
