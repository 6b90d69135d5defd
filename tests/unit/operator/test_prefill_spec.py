"""``spec.prefill`` (docs/pd.md): the section, the prefill tier's spec, the rules the CRD
and the model share (the apiserver's side is tests/invalid_genpools.py, run against a
real apiserver by tests/integration/test_operator.py), and the KV budget of each tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from genpool_operator.spec import (
    PREFILL_NEEDS_ONE_RANK,
    PREFILL_SAME_MODEL,
    GenPoolSpec,
    GenPoolSpecError,
)
from genpool_operator.spec_check import checked_spec
from genpool_operator.spec_sections import Prefill, ResourceRequirements

ROOT = Path(__file__).parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "genpool.dev_genpools.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
EXAMPLE = ROOT / "examples" / "genpool-pd.yaml"
PD: dict[str, Any] = {
    "replicas": 2,
    "model": "synthetic:tiny",
    "accelerator": "none",
    "resources": {"requests": {"cpu": "1"}},
    "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8},
    "prefill": {"replicas": 3},
}


def tier_of(spec: dict[str, Any]) -> GenPoolSpec:
    tier = GenPoolSpec.from_body(spec).prefill_tier()
    assert tier is not None
    return tier


def test_no_prefill_tier_by_default_and_one_replica_when_set() -> None:
    assert GenPoolSpec.from_body({}).prefill is None
    assert GenPoolSpec.from_body({}).prefill_tier() is None
    spec = GenPoolSpec.from_body({"prefill": {}})
    assert spec.prefill == Prefill(replicas=1, resources=None, model=None)


def test_the_prefill_tier_inherits_the_model_engine_and_resources_but_not_pausing() -> None:
    spec, tier = GenPoolSpec.from_body(PD), tier_of(PD)
    assert (tier.replicas, tier.model, tier.engine) == (3, spec.model, spec.engine)
    assert tier.resources == spec.resources and not tier.preemption_on
    assert tier.prefill is None and tier.tensor_parallel_size == 1
    own = tier_of({**PD, "prefill": {"resources": {"limits": {"cpu": "4"}}}})
    assert own.resources.limits == {"cpu": "4"}


def test_empty_prefill_resources_are_none_not_the_gen_tiers() -> None:
    # An explicit {} is a choice (no requests, no limits), not "unset".
    assert tier_of({**PD, "prefill": {"resources": {}}}).resources == ResourceRequirements()


def test_the_prefill_tier_may_name_the_gen_tiers_model_and_no_other() -> None:
    same = GenPoolSpec.from_body({**PD, "prefill": {"model": "synthetic:tiny"}})
    assert same.prefill is not None and same.prefill.model == "synthetic:tiny"
    for body in (
        {**PD, "prefill": {"model": "smollm2-135m"}},
        {"prefill": {"model": "synthetic:tiny"}},  # spec.model's default is smollm2-135m
    ):
        with pytest.raises(GenPoolSpecError) as info:
            GenPoolSpec.from_body(body)
        assert PREFILL_SAME_MODEL in str(info.value)


def test_tensor_parallelism_is_refused_with_a_message_naming_both_fields() -> None:
    with pytest.raises(GenPoolSpecError) as info:
        GenPoolSpec.from_body({"tensorParallelSize": 2, "prefill": {}})
    assert "spec.prefill needs spec.tensorParallelSize 1" in str(info.value)
    assert GenPoolSpec.from_body({"tensorParallelSize": 2}).prefill is None  # no tier: fine


def test_the_crd_rules_have_the_models_messages() -> None:
    messages = [" ".join(r["message"].split()) for r in SPEC_SCHEMA["x-kubernetes-validations"]]
    assert PREFILL_NEEDS_ONE_RANK in messages and PREFILL_SAME_MODEL in messages


@pytest.mark.parametrize(
    "prefill",
    [
        {},
        {"replicas": 0},
        {"replicas": 256},
        {"replicas": -1},
        {"replicas": 257},
        {"replicas": 1.5},
        {"replicas": "1"},
        {"model": ""},
        {"resources": {"limits": {"memory": "3Gi", "cpu": 2}}},
        {"resources": {"limits": {"memory": "3 Gi"}}},
        {"engine": {}},
    ],
)
def test_the_crd_and_the_model_take_the_same_prefill_sections(prefill: dict[str, Any]) -> None:
    # The structural half (types, bounds, patterns, unknown fields of the section; those
    # deeper are the apiserver's strict decoding); CEL is the apiserver's.
    schema = {**SPEC_SCHEMA["properties"]["prefill"], "additionalProperties": False}
    schema_ok = jsonschema.Draft4Validator(schema).is_valid(prefill)
    try:
        Prefill.model_validate(prefill)
        model_ok = True
    except ValueError:
        model_ok = False
    assert schema_ok == model_ok, prefill


def test_a_prefill_memory_limit_too_small_names_the_prefill_resources() -> None:
    spec = {
        "model": "smollm2-135m",
        "accelerator": "none",
        "resources": {"limits": {"memory": "2Gi"}},
        "prefill": {"resources": {"limits": {"memory": "1Gi"}}},
    }
    with pytest.raises(GenPoolSpecError) as info:
        checked_spec(spec)
    message = str(info.value)
    assert message.startswith("the prefill tier (its resources: spec.prefill.resources)")
    assert "resources.limits.memory" in message


def test_each_tier_has_its_own_kv_budget() -> None:
    spec = {
        "model": "smollm2-135m",
        "accelerator": "none",
        "resources": {"limits": {"memory": "2Gi"}},
        "prefill": {"resources": {"limits": {"memory": "3Gi"}}},
    }
    gen = checked_spec(spec)
    tier = gen.prefill_tier()
    assert tier is not None
    # 1 GiB more of limit is 1 GiB more of KV cache (weights and runtime are per pod).
    extra = tier.worker_config()["kv_cache_memory"] - gen.worker_config()["kv_cache_memory"]
    assert extra == 1 << 30


def test_the_example_is_a_cpu_pd_pool_whose_tiers_each_hold_one_request() -> None:
    spec = checked_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    assert spec.prefill is not None and spec.prefill.replicas == 1 and spec.replicas == 1
    tier = spec.prefill_tier()
    assert tier is not None and spec.accelerator == "none" and spec.tensor_parallel_size == 1
    assert tier.worker_config()["kv_cache_memory"] == spec.worker_config()["kv_cache_memory"]
