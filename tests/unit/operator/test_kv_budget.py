"""The KV-cache budget in worker.json: each branch of kv_budget's rule, the CPU derivation's
numbers, a limit too small refused at reconcile, and the spec fields' own rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.model_catalogue import known_shape
from genpool_core.names import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_KV_BLOCK_SIZE
from genpool_operator.kv_budget import CPU_RUNTIME_ALLOWANCE, FLOAT32_BYTES, cpu_weight_bytes
from genpool_operator.spec import GenPoolSpec, GenPoolSpecError
from genpool_operator.spec_check import checked_spec, spec_error

GiB = 1 << 30
CPU = {"accelerator": "none"}
# SmolLM2-135M on CPU: 134,515,008 float32 parameters and oneDNN's packed copy of the tied
# LM head (49,152 x 576), 2 x 30 layers x 3 KV heads x 64 x 4 bytes of KV per token.
SMOLLM2_WEIGHTS = (134_515_008 + 49_152 * 576) * 4
SMOLLM2_KV_PER_TOKEN = 2 * 30 * 3 * 64 * 4


def budget_of(**fields: Any) -> dict[str, Any]:
    config = checked_spec(fields).worker_config()
    return {k: config[k] for k in ("kv_cache_memory", "gpu_memory_utilization") if k in config}


def with_limit(memory: int | str, **fields: Any) -> dict[str, Any]:
    return {**CPU, "resources": {"limits": {"memory": memory}}, **fields}


def test_the_block_size_always_goes_in() -> None:
    assert checked_spec({}).worker_config()["kv_block_size"] == DEFAULT_KV_BLOCK_SIZE == 16
    config = checked_spec({**CPU, "engine": {"kvBlockSize": 64}}).worker_config()
    assert config["kv_block_size"] == 64


@pytest.mark.parametrize(
    ("fields", "budget"),
    [
        # 1. kvCacheMemory: bytes, on any device, whatever the memory limit
        ({"engine": {"kvCacheMemory": "8Gi"}}, {"kv_cache_memory": 8 * GiB}),
        ({**with_limit("2Gi"), "engine": {"kvCacheMemory": 1000}}, {"kv_cache_memory": 1000}),
        ({**CPU, "engine": {"kvCacheMemory": "1.5G"}}, {"kv_cache_memory": 1_500_000_000}),
        # 2. gpuMemoryUtilization
        ({"engine": {"gpuMemoryUtilization": 0.5}}, {"gpu_memory_utilization": 0.5}),
        ({"engine": {"gpuMemoryUtilization": 1}}, {"gpu_memory_utilization": 1}),
        # 3. nvidia, nothing set (a host memory limit is no GPU budget)
        ({}, {"gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION}),
        ({"resources": {"limits": {"memory": "16Gi"}}}, {"gpu_memory_utilization": 0.9}),
        # 5. CPU without a limit, or a model the operator cannot size: the worker's default
        (CPU, {}),
        ({**CPU, "resources": {"requests": {"memory": "2Gi"}}}, {}),
        (with_limit("64Mi", model="synthetic:demo"), {}),
        (with_limit("64Mi", model="/checkpoints/my-finetune"), {}),
    ],
)  # fmt: skip
def test_each_branch_of_the_rule(fields: dict[str, Any], budget: dict[str, Any]) -> None:
    assert budget_of(**fields) == budget


def test_a_cpu_memory_limit_leaves_the_kv_cache_the_rest() -> None:
    # 4. 2 GiB - 621 MiB of weights - the 1 GiB runtime allowance = 403 MiB.
    assert SMOLLM2_WEIGHTS == 651_306_240
    assert CPU_RUNTIME_ALLOWANCE == 1 << 30
    expected = 2 * GiB - SMOLLM2_WEIGHTS - GiB
    assert expected == 422_435_584
    assert budget_of(**with_limit("2Gi")) == {"kv_cache_memory": expected}
    assert budget_of(**with_limit(3 * GiB)) == {"kv_cache_memory": expected + GiB}


def test_a_known_checkpoint_directory_is_sized_too() -> None:
    volume = {"persistentVolumeClaim": {"claimName": "ckpt"}}
    fields = with_limit("40Gi", model="Llama-3.1-8B-Instruct", modelVolume=volume)
    weights = 8_030_261_248 * 4  # untied: its own LM head, no packed copy
    assert budget_of(**fields) == {"kv_cache_memory": 40 * GiB - weights - GiB}


def test_tensor_parallel_ranks_split_what_every_rank_leaves() -> None:
    shape = known_shape("smollm2-135m")
    assert shape is not None
    # Each rank keeps the embedding and a head (117 MB each); the layers are split.
    assert cpu_weight_bytes(shape, 3) == SMOLLM2_WEIGHTS + 2 * 2 * 49_152 * 576 * 4
    fields = with_limit("8Gi", tensorParallelSize=3)
    per_rank = (8 * GiB - cpu_weight_bytes(shape, 3) - 3 * GiB) // 3
    assert budget_of(**fields) == {"kv_cache_memory": per_rank}


def test_kv_bytes_per_token_of_the_catalogue() -> None:
    per_token = {
        "smollm2-135m": SMOLLM2_KV_PER_TOKEN,
        "Llama-3.1-8B": 2 * 32 * 8 * 128 * 4,
        "Llama-3.1-70B": 2 * 80 * 8 * 128 * 4,
    }
    for model, expected in per_token.items():
        shape = known_shape(model)
        assert shape is not None and shape.kv_bytes_per_token(FLOAT32_BYTES) == expected


@pytest.mark.parametrize(
    "fields",
    [
        with_limit("1Gi"),  # less than the weights and the allowance: nothing left
        with_limit("1700Mi"),  # 55 MiB left, one 2,048-token request needs 90 MiB
        with_limit("2Gi", engine={"maxSeqLen": 16384}),  # 403 MiB left, needs 720 MiB
        with_limit(2 * GiB, tensorParallelSize=3),  # three runtimes do not fit
        with_limit("-4Gi"),  # a quantity, but no memory
    ],
)
def test_a_limit_too_small_for_one_request_is_invalid_spec(fields: dict[str, Any]) -> None:
    with pytest.raises(GenPoolSpecError) as raised:
        checked_spec(fields)
    message = str(raised.value)
    assert message.startswith("spec.resources.limits.memory: ")
    assert "spec.engine.maxSeqLen=" in message and "for the KV cache of smollm2-135m" in message
    assert message.endswith("raise resources.limits.memory or lower engine.maxSeqLen")
    assert spec_error(fields) == f"invalid spec: {message}"  # Degraded=True/InvalidSpec


def test_the_message_says_what_the_limit_leaves_and_what_one_request_needs() -> None:
    error = spec_error(with_limit("1700Mi"))
    assert error == (
        "invalid spec: spec.resources.limits.memory: 1700Mi leaves 55 MiB per rank for the "
        "KV cache of smollm2-135m on CPU after 621 MiB of float32 weights and a 1024 MiB "
        "runtime allowance per rank (1 rank); one request of spec.engine.maxSeqLen=2048 "
        "needs 91 MiB per rank (128 blocks of 16 tokens and the padding block): raise "
        "resources.limits.memory or lower engine.maxSeqLen"
    )


def test_just_enough_for_one_request_is_enough() -> None:
    one_request = 129 * 16 * SMOLLM2_KV_PER_TOKEN  # 2,048 tokens and the padding block
    limit = SMOLLM2_WEIGHTS + GiB + one_request
    assert budget_of(**with_limit(limit)) == {"kv_cache_memory": one_request}
    assert spec_error(with_limit(limit - 1)) is not None


def test_the_block_size_rounds_the_request_up() -> None:
    # maxSeqLen 100 in blocks of 64 is 2 blocks = 128 tokens, and the padding block.
    need = 192 * SMOLLM2_KV_PER_TOKEN
    engine = {"maxSeqLen": 100, "kvBlockSize": 64}
    limit = SMOLLM2_WEIGHTS + GiB + need
    assert budget_of(**with_limit(limit, engine=engine)) == {"kv_cache_memory": need}
    message = str(spec_error(with_limit(limit - 1, engine=engine)))
    assert "(2 blocks of 64 tokens and the padding block)" in message


def test_an_unreadable_memory_limit_is_invalid_spec_on_cpu_only() -> None:
    # The CRD's quantity pattern allows the exponent; no memory is that large.
    error = spec_error(with_limit("1e999999999"))
    assert error is not None and error.startswith("invalid spec: spec.resources.limits.memory:")
    assert spec_error({"resources": {"limits": {"memory": "1e999999999"}}}) is None


def test_worker_config_refuses_what_checked_spec_refuses() -> None:
    spec = GenPoolSpec.from_body(with_limit("1Gi"))  # the CRD's rules alone pass it
    with pytest.raises(GenPoolSpecError, match=r"resources\.limits\.memory"):
        spec.worker_config()


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"kvCacheMemory": "8Gi", "gpuMemoryUtilization": 0.5},
         "spec.engine: engine.gpuMemoryUtilization is not allowed when engine.kvCacheMemory "
         "is set"),
        ({"kvCacheMemory": 0}, "spec.engine.kvCacheMemory: engine.kvCacheMemory must be at "
                               "least 1 byte"),
        ({"kvCacheMemory": "0Gi"}, "is not a positive quantity of bytes"),
        ({"kvCacheMemory": "-1Gi"}, "is not a positive quantity of bytes"),
        ({"kvCacheMemory": "100m"}, "is not a positive quantity of bytes"),
        ({"kvCacheMemory": "8GB"}, "is not a positive quantity of bytes"),
        ({"kvCacheMemory": 1.5}, "spec.engine.kvCacheMemory.int: Input should be a valid integer"),
        ({"gpuMemoryUtilization": 0}, "greater than 0"),
        ({"gpuMemoryUtilization": 1.1}, "less than or equal to 1"),
        ({"kvBlockSize": 0}, "greater than or equal to 1"),
        ({"kvBlockSize": 2048}, "less than or equal to 1024"),
    ],
)  # fmt: skip
def test_the_engine_budget_fields_rules(engine: dict[str, Any], message: str) -> None:
    with pytest.raises(GenPoolSpecError) as raised:
        GenPoolSpec.from_body({"engine": engine})
    assert message in str(raised.value)


def test_a_gpu_share_needs_the_gpu() -> None:
    with pytest.raises(GenPoolSpecError) as raised:
        GenPoolSpec.from_body({**CPU, "engine": {"gpuMemoryUtilization": 0.5}})
    assert str(raised.value) == (
        "spec: engine.gpuMemoryUtilization is not allowed when accelerator is none"
    )


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=70),
    st.from_regex(r"[0-9.+-]{0,30}([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,12})?", fullmatch=True),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers()),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(memory=VALUES, kv=VALUES, share=VALUES, block=VALUES, accelerator=st.sampled_from(
    ["none", "nvidia"]))  # fmt: skip
def test_any_values_give_a_budget_or_a_clear_spec_error(
    memory: object, kv: object, share: object, block: object, accelerator: str
) -> None:
    engine = {
        name: value
        for name, value in (("kvCacheMemory", kv), ("gpuMemoryUtilization", share),
                            ("kvBlockSize", block))
        if value is not None
    }  # fmt: skip
    raw: dict[str, Any] = {"accelerator": accelerator, "engine": engine}
    if memory is not None:
        raw["resources"] = {"limits": {"memory": memory}}
    try:
        config = checked_spec(raw).worker_config()
    except GenPoolSpecError as exc:
        assert str(exc).startswith("spec")
        return
    budget = [k for k in ("kv_cache_memory", "gpu_memory_utilization") if k in config]
    assert len(budget) <= 1 and (accelerator == "none" or budget)
    assert all(config[k] > 0 for k in budget)
