"""spec.inferencePool: the model's rules, the InferencePool builder, its conditions, and the
vendored InferencePool CRD it is checked against."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from genpool_core.names import (
    API_KIND,
    GROUP_VERSION,
    INFERENCE_POOL_API_VERSION,
    INFERENCE_POOL_GROUP,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_PLURAL,
    WORKER_PORT,
)
from genpool_operator.builders import PoolRef, build_children, build_statefulset
from genpool_operator.inference_pool import (
    CRD_NAME,
    INFERENCE_POOL_CONDITION,
    applied,
    build_inference_pool,
    crd_not_installed,
    is_owned_by,
    not_owned,
    rejected,
)
from genpool_operator.kube import object_path
from genpool_operator.spec import GenPoolSpec, GenPoolSpecError
from genpool_operator.spec_sections import InferencePool

CRDS = Path(__file__).parents[2] / "data" / "crds"
INFERENCE_POOL_CRD = CRDS / "inference.networking.k8s.io_inferencepools.yaml"
# Pinned in tests/data/crds/fetch-inferencepool-crd.sh (gateway-api-inference-extension v1.2.0).
PINNED_CRDS = {
    INFERENCE_POOL_CRD.name: "87d5eb89eabd776a1936b0df8e6c144e086d743374bd91c6b865cfb28dbd6b60",
    "inference.networking.x-k8s.io_inferenceobjectives.yaml": (
        "499f80fe3b7d9a8be54e454f1d9e7defb90adbf679167039e7f6df611f3c97f5"
    ),
}
POOL = PoolRef("chat", "serving", "0f6c2a1e-uid", 3)
PICKER = {"name": "chat-epp", "port": 9002}


def routed_spec(**picker: Any) -> GenPoolSpec:
    ref = {**PICKER, **picker}
    return GenPoolSpec.from_body({"inferencePool": {"enabled": True, "endpointPickerRef": ref}})


@pytest.fixture(scope="module")
def inference_pool_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(INFERENCE_POOL_CRD.read_text())
    return crd


# ---- the vendored CRD ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PINNED_CRDS))
def test_the_vendored_crds_are_the_pinned_upstream_files(name: str) -> None:
    assert hashlib.sha256((CRDS / name).read_bytes()).hexdigest() == PINNED_CRDS[name]
    pin = f"{name} {PINNED_CRDS[name]}"
    assert pin in (CRDS / "fetch-inferencepool-crd.sh").read_text()
    assert PINNED_CRDS[name] in (CRDS / "README.md").read_text()


def test_every_vendored_crd_is_pinned() -> None:
    assert {path.name for path in CRDS.glob("*.yaml")} == set(PINNED_CRDS)


def test_our_coordinates_are_the_crds(inference_pool_crd: dict[str, Any]) -> None:
    spec = inference_pool_crd["spec"]
    served = [v["name"] for v in spec["versions"] if v["served"]]
    assert inference_pool_crd["metadata"]["name"] == CRD_NAME
    assert (spec["group"], spec["names"]["kind"]) == (INFERENCE_POOL_GROUP, INFERENCE_POOL_KIND)
    assert spec["names"]["plural"] == INFERENCE_POOL_PLURAL
    assert f"{INFERENCE_POOL_GROUP}/{served[0]}" == INFERENCE_POOL_API_VERSION


def test_our_failure_modes_are_the_crds(inference_pool_crd: dict[str, Any]) -> None:
    schema = inference_pool_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    picker_schema = schema["properties"]["spec"]["properties"]["endpointPickerRef"]
    mode = picker_schema["properties"]["failureMode"]
    picker = routed_spec().inference_pool.endpoint_picker_ref
    assert picker is not None
    assert mode["default"] == picker.failure_mode
    for value in mode["enum"]:
        assert routed_spec(failureMode=value).inference_pool.endpoint_picker_ref is not None


# ---- the spec ------------------------------------------------------------------------------


def test_off_by_default_and_no_child() -> None:
    spec = GenPoolSpec.from_body({})
    assert not spec.inference_pool.enabled
    assert spec.inference_pool.endpoint_picker_ref is None
    kinds = {c["kind"] for c in build_children(POOL, spec, image_default="w:1", admin_token=None)}
    assert INFERENCE_POOL_KIND not in kinds  # applied beside the children, only when enabled


def test_camel_case_fields_and_defaults() -> None:
    picker = routed_spec().inference_pool.endpoint_picker_ref
    assert picker is not None
    assert (picker.name, picker.port, picker.failure_mode) == ("chat-epp", 9002, "FailClose")


def test_disabled_may_keep_its_picker() -> None:
    # Switching routing off must not make the user delete the picker's address.
    body = {"inferencePool": {"enabled": False, "endpointPickerRef": PICKER}}
    assert not GenPoolSpec.from_body(body).inference_pool.enabled


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"enabled": True},
            "spec.inferencePool: inferencePool.endpointPickerRef is required when "
            "inferencePool.enabled is true",
        ),
        (
            {"enabled": True, "endpointPickerRef": {"name": "epp"}},
            "spec.inferencePool.endpointPickerRef.port: Field required",
        ),
        (
            {"enabled": True, "endpointPickerRef": {"name": "", "port": 9002}},
            "spec.inferencePool.endpointPickerRef.name: String should have at least 1 character",
        ),
        (
            {"enabled": True, "endpointPickerRef": {"name": "epp", "port": 65536}},
            "spec.inferencePool.endpointPickerRef.port: Input should be less than or equal to "
            "65535",
        ),
        (
            {"enabled": True, "endpointPickerRef": {"name": "epp", "port": "9002"}},
            "spec.inferencePool.endpointPickerRef.port: Input should be a valid integer",
        ),
        (
            {"enabled": "yes", "endpointPickerRef": PICKER},
            "spec.inferencePool.enabled: Input should be a valid boolean",
        ),
        (
            {"endpointPickerRef": {**PICKER, "namespace": "gw"}},
            "spec.inferencePool.endpointPickerRef.namespace: Extra inputs are not permitted",
        ),
    ],
)
def test_invalid_settings_name_the_field(body: dict[str, Any], error: str) -> None:
    with pytest.raises(GenPoolSpecError) as info:
        GenPoolSpec.from_body({"inferencePool": body})
    assert error in str(info.value)


# ---- the builder ---------------------------------------------------------------------------


def test_selects_the_pools_worker_pods_on_the_worker_port() -> None:
    spec = routed_spec()
    pool = build_inference_pool(POOL, spec.inference_pool)
    template = build_statefulset(POOL, spec, "w:1")["spec"]["template"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    ports = [p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]]
    assert pool["spec"]["targetPorts"] == [{"number": WORKER_PORT}]
    assert WORKER_PORT in ports


def test_another_pools_pods_are_not_selected() -> None:
    other = PoolRef("batch", "serving", "uid-2", 1)
    selector = build_inference_pool(POOL, routed_spec().inference_pool)["spec"]["selector"]
    labels = build_statefulset(other, routed_spec(), "w:1")["spec"]["template"]["metadata"]
    assert not selector["matchLabels"].items() <= labels["labels"].items()


def test_named_after_the_pool_and_owned_by_it() -> None:
    pool = build_inference_pool(POOL, routed_spec().inference_pool)
    meta = pool["metadata"]
    assert (pool["apiVersion"], pool["kind"]) == (INFERENCE_POOL_API_VERSION, "InferencePool")
    assert (meta["name"], meta["namespace"]) == ("chat", "serving")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": GROUP_VERSION,
            "kind": API_KIND,
            "name": "chat",
            "uid": POOL.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert is_owned_by(pool, POOL)
    assert not is_owned_by(pool, PoolRef("chat", "serving", "another-uid", 1))
    assert not is_owned_by({"metadata": {"name": "chat"}}, POOL)
    assert (
        object_path(pool)
        == "/apis/inference.networking.k8s.io/v1/namespaces/serving/inferencepools/chat"
    )


def test_endpoint_picker_ref_as_given() -> None:
    built = build_inference_pool(POOL, routed_spec(failureMode="FailOpen").inference_pool)
    assert built["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "chat-epp",
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }


def test_disabled_settings_build_nothing() -> None:
    with pytest.raises(ValueError, match="endpointPickerRef is required"):
        build_inference_pool(POOL, InferencePool())


@pytest.mark.parametrize("mode", ["FailOpen", "FailClose"])
def test_the_object_matches_the_upstream_schema(
    inference_pool_crd: dict[str, Any], mode: str
) -> None:
    # Structure, types, bounds and patterns; the CEL rules are checked by the apiserver in
    # tests/integration/test_inference_pool.py.
    schema = dict(inference_pool_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    built = build_inference_pool(POOL, routed_spec(failureMode=mode).inference_pool)
    jsonschema.validate(built, schema)
    bad = {**built, "spec": {**built["spec"], "targetPorts": [{"number": 0}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_builds_the_same_object_twice() -> None:
    spec = routed_spec()
    assert build_inference_pool(POOL, spec.inference_pool) == build_inference_pool(
        POOL, spec.inference_pool
    )


# ---- conditions ----------------------------------------------------------------------------


def test_applied_condition_says_what_is_routed() -> None:
    picker = routed_spec().inference_pool.endpoint_picker_ref
    assert picker is not None
    condition = applied(POOL, picker)
    assert (condition.type, condition.status, condition.reason) == (
        INFERENCE_POOL_CONDITION,
        True,
        "Applied",
    )
    assert "genpool.dev/pool=chat" in condition.message
    assert f"port {WORKER_PORT}" in condition.message
    assert "chat-epp:9002 (FailClose)" in condition.message


def test_missing_crd_condition_names_the_crd_and_the_fix() -> None:
    condition = crd_not_installed()
    assert (condition.status, condition.reason) == (False, "CRDNotInstalled")
    assert "inferencepools.inference.networking.k8s.io" in condition.message
    assert "inference.networking.k8s.io/v1" in condition.message
    assert "install the Gateway API Inference Extension" in condition.message


@pytest.mark.parametrize(("status", "reason"), [(403, "Forbidden"), (422, "Rejected")])
def test_refused_condition_keeps_the_apiservers_words(status: int, reason: str) -> None:
    condition = rejected(status, "spec.targetPorts: Invalid value")
    assert (condition.status, condition.reason) == (False, reason)
    assert condition.message == f"{status}: spec.targetPorts: Invalid value"


def test_not_owned_condition_names_the_inference_pool() -> None:
    condition = not_owned(POOL)
    assert (condition.type, condition.status, condition.reason) == (
        INFERENCE_POOL_CONDITION,
        False,
        "NotOwned",
    )
    assert "InferencePool chat exists and is not this GenPool's" in condition.message
