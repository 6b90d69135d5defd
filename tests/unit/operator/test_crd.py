"""The CRD and the spec model agree: fields, defaults, bounds, enums; every field described."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import annotated_types
import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from genpool_core.scaler import ScaleInputs
from genpool_operator.quantity import POSITIVE_QUANTITY, QUANTITY
from genpool_operator.spec import (
    GPU_SHARE_NEEDS_GPU,
    KV_EVENTS_NEED_CACHING,
    GenPoolSpec,
    GenPoolSpecError,
)
from genpool_operator.spec_sections import (
    DRAFT_LAYERS_EARLY_EXIT_ONLY,
    DRAFT_LAYERS_NEEDED,
    KV_CACHE_MEMORY_POSITIVE,
    LOOKUP_NGRAM_ONLY,
    LOOKUP_ORDER,
    ONE_KV_BUDGET,
)

CRD_PATH = Path(__file__).parents[3] / "crds" / "genpool.dev_genpools.yaml"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def root_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = root_schema(crd)["properties"]["spec"]
    return schema


def walk_properties(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, prop in schema.get("properties", {}).items():
        yield f"{path}.{name}", prop
        yield from walk_properties(prop, f"{path}.{name}")
    items = schema.get("items")
    if items:
        yield f"{path}[]", items
        yield from walk_properties(items, f"{path}[]")


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None`` or ``list[X]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = model_of(arg)
        if found:
            return found
    return None


def walk_fields(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        alias = field.alias or name
        yield f"{path}.{alias}", field
        nested = model_of(field.annotation)
        if nested:
            suffix = "[]" if typing.get_origin(field.annotation) is list else ""
            yield from walk_fields(nested, f"{path}.{alias}{suffix}")


def test_the_crd_is_a_valid_customresourcedefinition(crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def test_every_crd_property_has_a_description(crd: dict[str, Any]) -> None:
    # The apiserver forbids anything but name/generateName under the root metadata,
    # a description included; kubectl explain documents ObjectMeta itself.
    missing = [
        path
        for path, prop in walk_properties(root_schema(crd))
        if not str(prop.get("description", "")).strip() and path != ".metadata"
    ]
    assert missing == []


def test_the_crd_and_the_model_have_the_same_fields(crd: dict[str, Any]) -> None:
    crd_paths = {path for path, _ in walk_properties(spec_schema(crd)) if not path.endswith("[]")}
    model_paths = {path for path, _ in walk_fields(GenPoolSpec)}
    assert crd_paths == model_paths


def test_the_crd_defaults_are_the_model_defaults(crd: dict[str, Any]) -> None:
    fields = dict(walk_fields(GenPoolSpec))
    crd_defaults = {
        path: prop["default"]
        for path, prop in walk_properties(spec_schema(crd))
        if "default" in prop and prop["default"] != {}
    }
    model_defaults = {
        path: field.get_default(call_default_factory=True)
        for path, field in fields.items()
        if not field.is_required()
        and field.get_default(call_default_factory=True) not in (None, {}, [])
        and not isinstance(field.get_default(call_default_factory=True), BaseModel)
    }
    assert crd_defaults == model_defaults
    # An object the CRD defaults to {} is one the model builds from its own defaults.
    for path, prop in walk_properties(spec_schema(crd)):
        if prop.get("default") == {} and path in fields:
            assert not fields[path].is_required(), path


BOUND_KEYS = {
    annotated_types.Ge: "ge",
    annotated_types.Le: "le",
    annotated_types.Gt: "gt",
    annotated_types.Lt: "lt",
}


def model_bounds(field: Any) -> dict[str, float]:
    bounds: dict[str, float] = {}
    for item in field.metadata:
        for kind, key in BOUND_KEYS.items():
            if isinstance(item, kind):
                bounds[key] = getattr(item, key)
        if isinstance(item, annotated_types.MinLen):
            bounds["min_length"] = item.min_length
        if isinstance(item, annotated_types.MaxLen):
            bounds["max_length"] = item.max_length
    return bounds


def crd_bounds(prop: dict[str, Any]) -> dict[str, float]:
    bounds: dict[str, float] = {}
    if "minimum" in prop:
        bounds["gt" if prop.get("exclusiveMinimum") else "ge"] = prop["minimum"]
    if "maximum" in prop:
        bounds["lt" if prop.get("exclusiveMaximum") else "le"] = prop["maximum"]
    for crd_key, key in (("minLength", "min_length"), ("maxLength", "max_length")):
        if crd_key in prop:
            bounds[key] = prop[crd_key]
    if "maxItems" in prop:
        bounds["max_length"] = prop["maxItems"]
    return bounds


def test_the_crd_bounds_are_the_model_bounds(crd: dict[str, Any]) -> None:
    fields = dict(walk_fields(GenPoolSpec))
    for path, prop in walk_properties(spec_schema(crd)):
        if path in fields:
            assert crd_bounds(prop) == model_bounds(fields[path]), path


def literal_values(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return {value for arg in typing.get_args(annotation) for value in literal_values(arg)}


def test_the_crd_enums_are_the_model_literals(crd: dict[str, Any]) -> None:
    fields = dict(walk_fields(GenPoolSpec))
    enums = {
        p: set(prop["enum"]) for p, prop in walk_properties(spec_schema(crd)) if "enum" in prop
    }
    assert enums
    for path, values in enums.items():
        assert literal_values(fields[path].annotation) == values, path


def test_scale_and_status_subresources(crd: dict[str, Any]) -> None:
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c.get("priority", 0) for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Mode": 0, "Ready": 0, "Prefill": 0, "Below-T": 0, "Credit": 0, "Headroom": 0, "Cap": 0,
        "Paused": 0, "Desired": 0, "SLO": 0, "Age": 0, "Victims": 1, "InSync": 1,
        "Last-Tune": 1, "TTFT-P90": 1, "Scaling": 1, "Forecast": 1, "Per-Replica": 1,
        "Tail": 1, "Budget": 1,
    }  # fmt: skip
    status = root_schema(crd)["properties"]["status"]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".status.conditions[?(@.type=="):  # a condition's status
            assert column["jsonPath"].endswith(")].status") and column["type"] == "string"
            continue
        path = column["jsonPath"].lstrip(".").split(".")
        if path[0] == "status":
            node = status
            for part in path[1:]:
                node = node["properties"][part]
            assert node["type"] == column["type"] or column["type"] == "date", column


def test_the_status_schema_keeps_every_scaling_input(crd: dict[str, Any]) -> None:
    """The apiserver prunes status fields its schema lacks: each key of
    ``ScaleInputs.to_status`` is in ``status.scaling.inputs``, with its JSON type."""
    inputs = ScaleInputs(
        arrival_rate=1.0, forecast=1.5, service_s=2.0, capacity=0.8, occupancy=0.5, tail=0.4,
        pause_budget=3, backlog=0, forecast_replicas=2, backlog_replicas=0, tail_replicas=0,
        consolidated=1, per_replica_rate=6.4,
    ).to_status()  # fmt: skip
    status = root_schema(crd)["properties"]["status"]
    schema = status["properties"]["scaling"]["properties"]["inputs"]["properties"]
    assert set(schema) == set(inputs)
    json_type = {bool: "boolean", int: "integer", float: "number"}
    assert {k: json_type[type(v)] for k, v in inputs.items()} == {
        k: v["type"] for k, v in schema.items()
    }


def engine_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = spec_schema(crd)["properties"]["engine"]
    return schema


def test_the_crd_spells_the_quantity_patterns_as_the_model_does(crd: dict[str, Any]) -> None:
    limits = spec_schema(crd)["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"]["pattern"] == QUANTITY.pattern
    assert engine_schema(crd)["properties"]["kvCacheMemory"]["pattern"] == POSITIVE_QUANTITY.pattern


def rule_messages(schema: dict[str, Any]) -> list[str]:
    return [" ".join(rule["message"].split()) for rule in schema["x-kubernetes-validations"]]


def test_the_kv_budget_rules_have_the_models_messages(crd: dict[str, Any]) -> None:
    assert rule_messages(engine_schema(crd)) == [ONE_KV_BUDGET]
    kv_cache_memory = engine_schema(crd)["properties"]["kvCacheMemory"]
    assert rule_messages(kv_cache_memory) == [KV_CACHE_MEMORY_POSITIVE]
    assert GPU_SHARE_NEEDS_GPU in rule_messages(spec_schema(crd))
    assert KV_EVENTS_NEED_CACHING in rule_messages(spec_schema(crd))
    speculative = engine_schema(crd)["properties"]["speculative"]
    assert rule_messages(speculative) == [
        LOOKUP_ORDER, DRAFT_LAYERS_NEEDED, DRAFT_LAYERS_EARLY_EXIT_ONLY, LOOKUP_NGRAM_ONLY,
    ]  # fmt: skip


@cache
def spec_validator() -> jsonschema.Draft4Validator:
    """The CRD's structural checks (types, bounds, patterns; not CEL). Draft 4 is the
    dialect of ``exclusiveMinimum: true``; Go's ``$`` (end of text) is Python's ``\\Z``,
    which the callers keep to by sending no trailing newline."""
    return jsonschema.Draft4Validator(spec_schema(yaml.safe_load(CRD_PATH.read_text())))


def schema_accepts(spec: dict[str, Any]) -> bool:
    return bool(spec_validator().is_valid(spec))


def model_accepts(spec: dict[str, Any]) -> bool:
    try:
        GenPoolSpec.from_body(spec)
    except GenPoolSpecError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=70),
    st.from_regex(QUANTITY, fullmatch=True),
    st.from_regex(POSITIVE_QUANTITY, fullmatch=True),
).filter(lambda text: not text.endswith("\n")))  # fmt: skip
def test_the_crd_and_the_model_take_the_same_kv_cache_memory_strings(text: str) -> None:
    # A string is the pattern's alone (the CEL rule passes every string).
    spec = {"engine": {"kvCacheMemory": text}}
    assert schema_accepts(spec) == model_accepts(spec), text


@pytest.mark.parametrize(
    "engine",
    [{"gpuMemoryUtilization": share} for share in (0, 1e-9, 0.5, 1, 1.0000001, -1, "0.5")]
    + [{"kvBlockSize": size} for size in (0, 1, 16, 1024, 1025, 16.0, "16")]
    + [{"kvCacheMemory": value} for value in (1, 8589934592, 1.5, True, [1])]
    + [{"maxPrefillTokensPerPass": n} for n in (-1, 0, 1, 512, 1048576, 1048577, 64.0, "64")],
)
def test_the_crd_and_the_model_take_the_same_budget_values(engine: dict[str, Any]) -> None:
    spec = {"engine": engine}
    assert schema_accepts(spec) == model_accepts(spec), engine
