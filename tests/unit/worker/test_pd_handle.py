"""The P/D wire contract (docs/pd.md): kv_transfer_params classified, the GenPool handle
round-trips, every malformed field is a HandleError naming it, and nothing else escapes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_worker.kv_layout import KVLayout
from genpool_worker.pd.handle import (
    PREFILL_LEG_PARAMS,
    Handle,
    HandleError,
    ParamsKind,
    classify,
    handle_params,
    parse_handles,
    prompt_digest,
)

LAYOUT = KVLayout("smollm2-135m", "float32", 16, num_layers=30, num_kv_heads=3, head_dim=64)


def make_handle(**changes: Any) -> Handle:
    fields: dict[str, Any] = dict(
        transfer_id="0" * 32, host="10.0.0.5", port=8000, layout=LAYOUT,
        num_prompt_tokens=40, prompt_digest=prompt_digest(list(range(40))), num_blocks=3,
        num_bytes=LAYOUT.num_bytes(3), first_token=42, age_s=0.2, first_token_age_s=0.01,
        queue_s=0.1, prefill_s=0.09, expires_in_s=30.0,
    )  # fmt: skip
    return Handle(**(fields | changes))


def test_classify_tells_the_four_apart() -> None:
    assert classify(None) is ParamsKind.NONE and classify({}) is ParamsKind.NONE
    assert classify(PREFILL_LEG_PARAMS) is ParamsKind.PREFILL_LEG
    assert classify(make_handle().to_params()) is ParamsKind.GENPOOL
    vllm_nixl = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "e",
        "remote_block_ids": [1, 2],
        "remote_host": "10.0.0.9",
        "remote_port": 5600,
    }
    assert classify(vllm_nixl) is ParamsKind.FOREIGN


def test_a_handle_round_trips_through_json_shaped_params() -> None:
    handle = make_handle()
    assert parse_handles(handle.to_params(), 1) == [handle]


def test_the_layout_counts_the_bytes_a_pull_moves() -> None:
    # 30 layers x K and V x 3 heads x 16 rows x 64 dims x 4 bytes per block
    assert LAYOUT.num_bytes(1) == 30 * 2 * 3 * 16 * 64 * 4
    other = KVLayout("smollm2-135m", "bfloat16", 16, num_layers=30, num_kv_heads=3, head_dim=64)
    assert LAYOUT.mismatch(other) == "dtype" and LAYOUT.mismatch(LAYOUT) is None
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        KVLayout("m", "float32", 16, 1, 1, 1, tensor_parallel_size=2)


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("version",), 2, "genpool.version"),
        (("transfer_id",), "../../etc", "genpool.transfer_id"),
        (("port",), 0, "genpool.port"),
        (("port",), True, "genpool.port"),
        (("host",), "", "genpool.host"),
        (("num_blocks",), 4, "genpool.num_blocks"),
        (("num_bytes",), 1, "genpool.num_bytes"),
        (("age_s",), float("nan"), "genpool.age_s"),
        (("first_token_age_s",), 5.0, "genpool.first_token_age_s"),
        (("layout", "dtype"), "float64", "genpool.layout"),
        (("layout", "block_size"), "16", "genpool.layout.block_size"),
        (("layout", "tensor_parallel_size"), 3, "genpool.layout"),
        (("prompt_digest",), "xyz", "genpool.prompt_digest"),
    ],
)
def test_a_malformed_field_is_named(path: tuple[str, ...], value: object, named: str) -> None:
    params = make_handle().to_params()
    target = params["genpool"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(HandleError) as error:
        parse_handles(params, 1)
    assert error.value.field.startswith(f"kv_transfer_params.{named}")


def test_a_missing_field_is_named() -> None:
    params = make_handle().to_params()
    del params["genpool"]["first_token"]
    with pytest.raises(HandleError, match=r"kv_transfer_params\.genpool\.first_token: is missing"):
        parse_handles(params, 1)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(make_handle().to_params()["genpool"])), _json)
def test_any_value_in_any_field_parses_or_is_a_handle_error(name: str, value: object) -> None:
    params = copy.deepcopy(make_handle().to_params())
    params["genpool"][name] = value
    try:
        parse_handles(params, 1)
    except HandleError as exc:
        assert exc.field.startswith("kv_transfer_params.genpool")


def test_the_digest_is_the_prompts() -> None:
    assert prompt_digest([1, 2, 3]) != prompt_digest([1, 2, 4])
    assert prompt_digest([1, 2, 3]) == prompt_digest([1, 2, 3])


def test_a_prompt_list_has_one_handle_per_prompt_in_order() -> None:
    first, second = make_handle(), make_handle()
    params = handle_params([first, second])
    assert [h["transfer_id"] for h in params["genpool"]] == [first.transfer_id,
                                                             second.transfer_id]  # fmt: skip
    assert parse_handles(params, 2) == [first, second]
    with pytest.raises(HandleError, match=r"kv_transfer_params\.genpool: 2 handles for 3"):
        parse_handles(params, 3)
    params["genpool"][1]["port"] = "80"
    with pytest.raises(HandleError, match=r"kv_transfer_params\.genpool\[1\]\.port"):
        parse_handles(params, 2)
    assert handle_params([first]) == first.to_params()  # one prompt: an object, as before
