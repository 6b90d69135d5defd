"""P/D conformance (docs/pd.md): both roles driven through llm-d's sidecar exchange as
its pd-sidecar speaks it, greedy text equal to the colocated worker's, every handle case
(GenPool, foreign, malformed, another layout, another prompt) and the decode worker
sending the prefill leg itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from genpool_worker.pd.handle import PREFILL_LEG_PARAMS
from tests.worker.conftest import RunningWorker
from tests.worker.pd_support import (
    SIDECAR_PREFILL_PARAMS,
    endpoint,
    metric,
    sidecar_exchange,
    wait_no_held_kv,
)

Factory = Callable[..., RunningWorker]
COMPLETION = {"prompt": "The quick brown fox jumps over the lazy dog. " * 6, "max_tokens": 24}
CHAT = {"messages": [{"role": "user", "content": "Say something long, please."}],
        "max_completion_tokens": 20}  # fmt: skip


def text_of(reply: dict[str, Any]) -> str:
    choice = reply["choices"][0]
    return str(choice["text"] if "text" in choice else choice["message"]["content"])


def test_the_sidecar_speaks_what_the_worker_implements() -> None:
    # The Python sidecar of these tests and the worker's own prefill leg send the same
    # kv_transfer_params (the nixlv2 connector's).
    assert SIDECAR_PREFILL_PARAMS == PREFILL_LEG_PARAMS


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION),
                                            ("/v1/chat/completions", CHAT)])  # fmt: skip
def test_p_d_text_equals_the_colocated_workers(
    worker_factory: Factory, path: str, body: dict[str, Any]
) -> None:
    prefill = worker_factory(role="prefill")
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url))
    colocated = worker_factory()
    expected = colocated.client().post(path, json=body).json()
    answer, reply = sidecar_exchange(prefill.url, decode.url, path, body)
    assert reply.status_code == 200, reply.text
    assert text_of(reply.json()) == text_of(expected)
    assert reply.json()["usage"] == expected["usage"]
    handle = answer["kv_transfer_params"]["genpool"]
    assert answer["usage"]["completion_tokens"] == 1 and handle["num_prompt_tokens"] > 0
    assert metric(decode.url, "genpool_kv_transfers_total", side="import", outcome="ok") == 1
    assert (
        metric(decode.url, "genpool_kv_transfer_bytes_total", side="import") == handle["num_bytes"]
    )
    assert (
        metric(prefill.url, "genpool_kv_transfer_bytes_total", side="export") == handle["num_bytes"]
    )
    assert metric(prefill.url, "genpool_kv_transfers_total", side="export", outcome="ok") == 1
    wait_no_held_kv(prefill.url)
    wait_no_held_kv(decode.url)


def test_a_streamed_decode_leg_streams_the_first_token_first(worker_factory: Factory) -> None:
    prefill, colocated = worker_factory(role="prefill"), worker_factory()
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url))
    body = COMPLETION | {"stream": True}
    with httpx.Client(timeout=60) as http:
        leg = http.post(prefill.url + "/v1/completions",
                        json=body | {"kv_transfer_params": SIDECAR_PREFILL_PARAMS, "stream": False,
                                     "max_tokens": 1}).json()  # fmt: skip
        pieces = []
        with http.stream(
            "POST",
            decode.url + "/v1/completions",
            json=body | {"kv_transfer_params": leg["kv_transfer_params"]},
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    pieces.append(httpx.Response(200, content=line[6:]).json())
    expected = colocated.client().post("/v1/completions", json=COMPLETION).json()
    text = "".join(p["choices"][0]["text"] for p in pieces)
    assert text == text_of(expected)
    assert pieces[0]["choices"][0]["text"] == leg["choices"][0]["text"]  # the prefill's token
    assert pieces[-1]["usage"]["completion_tokens"] == COMPLETION["max_tokens"]


def test_the_decode_worker_sends_the_prefill_leg_itself(worker_factory: Factory) -> None:
    prefill_a, prefill_b = worker_factory(role="prefill"), worker_factory(role="prefill")
    decode = worker_factory(role="decode", admin_token="t")
    colocated = worker_factory()
    endpoints = [w.url.removeprefix("http://") for w in (prefill_a, prefill_b)]
    with decode.client(headers={"authorization": "Bearer t"}) as admin:
        assert admin.put("/prefillers", json={"endpoints": endpoints}).status_code == 200
        assert admin.put("/prefillers", json={"endpoints": ["nope"]}).status_code == 422
    assert decode.client().get("/prefillers").json() == {"endpoints": endpoints}
    expected = text_of(colocated.client().post("/v1/completions", json=COMPLETION).json())
    for _ in range(4):  # round robin over the two
        reply = decode.client().post("/v1/completions", json=COMPLETION)
        assert text_of(reply.json()) == expected
    for prefill in (prefill_a, prefill_b):
        assert metric(prefill.url, "genpool_kv_transfers_total", side="export", outcome="ok") == 2
    # A router's header is followed to an endpoint the worker does not know only when it
    # is told to trust the router (docs/operations.md#threat-model).
    header = {"x-prefiller-host-port": endpoints[0]}
    trusting = worker_factory(role="decode", trust_prefiller_header=True)
    reply = trusting.client().post("/v1/completions", json=COMPLETION, headers=header)
    assert text_of(reply.json()) == expected
    assert metric(prefill_a.url, "genpool_kv_transfers_total", side="export", outcome="ok") == 3


def test_an_unreachable_prefiller_falls_back_to_a_local_prefill(worker_factory: Factory) -> None:
    decode, colocated = worker_factory(role="decode", prefillers="127.0.0.1:9"), worker_factory()
    reply = decode.client().post("/v1/completions", json=COMPLETION)
    assert text_of(reply.json()) == text_of(
        colocated.client().post("/v1/completions", json=COMPLETION).json()
    )
    assert metric(decode.url, "genpool_kv_transfer_fallbacks_total", reason="prefill_failed") == 1
    bad = decode.client().post(
        "/v1/completions", json=COMPLETION, headers={"x-prefiller-host-port": "x"}
    )
    assert bad.status_code == 400 and "x-prefiller-host-port" in bad.json()["error"]["message"]


def test_roles_refuse_or_fall_back_as_the_table_says(worker_factory: Factory) -> None:
    prefill, decode = worker_factory(role="prefill"), worker_factory(role="decode")
    leg = COMPLETION | {"kv_transfer_params": PREFILL_LEG_PARAMS, "max_tokens": 1}
    refused = decode.client().post("/v1/completions", json=leg)
    assert refused.status_code == 400 and "do_remote_decode" in refused.json()["error"]["message"]
    streamed = prefill.client().post("/v1/completions", json=leg | {"stream": True})
    assert streamed.status_code == 400
    handle = prefill.client().post("/v1/completions", json=leg).json()["kv_transfer_params"]
    # A prefill worker given a handle prefills locally (counted) and frees the export.
    reply = prefill.client().post(
        "/v1/completions", json=COMPLETION | {"kv_transfer_params": handle}
    )
    assert reply.status_code == 200
    assert metric(prefill.url, "genpool_kv_transfer_fallbacks_total", reason="role") == 1
    assert (
        metric(prefill.url, "genpool_kv_transfers_total", side="export", outcome="cancelled") == 1
    )
    wait_no_held_kv(prefill.url)


def test_a_foreign_handle_is_prefilled_locally(worker_factory: Factory) -> None:
    decode, colocated = worker_factory(role="decode"), worker_factory()
    nixl = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "vllm-1",
        "remote_block_ids": [1, 2, 3],
        "remote_host": "10.0.0.9",
        "remote_port": 5600,
    }
    reply = decode.client().post("/v1/completions", json=COMPLETION | {"kv_transfer_params": nixl})
    expected = colocated.client().post("/v1/completions", json=COMPLETION).json()
    assert text_of(reply.json()) == text_of(expected)
    assert metric(decode.url, "genpool_kv_transfer_fallbacks_total", reason="foreign") == 1


def test_a_malformed_or_mismatched_handle_is_refused_naming_the_field(
    worker_factory: Factory,
) -> None:
    prefill, decode = worker_factory(role="prefill"), worker_factory(role="decode")
    other_blocks = worker_factory(role="decode", kv_block_size=32)

    def fresh_handle() -> dict[str, Any]:
        answer, _ = sidecar_exchange(prefill.url, prefill.url, "/v1/completions",
                                     COMPLETION | {"max_tokens": 1})  # fmt: skip
        return dict(answer["kv_transfer_params"])

    cases: list[tuple[RunningWorker, dict[str, Any], dict[str, Any], str]] = []
    malformed = fresh_handle()
    malformed["genpool"] = dict(malformed["genpool"], port="8000")
    cases.append((decode, malformed, COMPLETION, "kv_transfer_params.genpool.port"))
    cases.append(
        (other_blocks, fresh_handle(), COMPLETION, "kv_transfer_params.genpool.layout.block_size")
    )
    other_prompt = COMPLETION | {"prompt": "another prompt entirely"}
    cases.append(
        (decode, fresh_handle(), other_prompt, "kv_transfer_params.genpool.num_prompt_tokens")
    )
    for worker, params, body, field in cases:
        reply = worker.client().post("/v1/completions", json=body | {"kv_transfer_params": params})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["message"].startswith(field)
    assert metric(decode.url, "genpool_kv_transfers_total", side="import", outcome="ok") == 0


def test_the_pull_address_is_the_workers_not_the_host_header(worker_factory: Factory) -> None:
    # llm-d's sidecar forwards the prefill leg with the client's Host (its own address).
    prefill, colocated = worker_factory(role="prefill"), worker_factory()
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url))
    leg = COMPLETION | {"kv_transfer_params": SIDECAR_PREFILL_PARAMS, "stream": False,
                        "max_tokens": 1, "max_completion_tokens": 1, "min_tokens": 1}  # fmt: skip
    answer = prefill.client().post("/v1/completions", json=leg, headers={"host": "sidecar:8000"})
    handle = answer.json()["kv_transfer_params"]
    assert (handle["genpool"]["host"], handle["genpool"]["port"]) == (
        "127.0.0.1",
        int(prefill.url.rsplit(":", 1)[1]),
    )
    reply = decode.client().post(
        "/v1/completions", json=COMPLETION | {"kv_transfer_params": handle}
    )
    assert text_of(reply.json()) == text_of(
        colocated.client().post("/v1/completions", json=COMPLETION).json()
    )
    assert metric(decode.url, "genpool_kv_transfers_total", side="import", outcome="ok") == 1


def test_a_null_handle_is_prefilled_here_not_sent_again(worker_factory: Factory) -> None:
    # The sidecar's decode leg when the prefill answer had no handle: kv_transfer_params null.
    prefill = worker_factory(role="prefill")
    decode = worker_factory(role="decode", prefillers=prefill.url.removeprefix("http://"))
    reply = decode.client().post("/v1/completions", json=COMPLETION | {"kv_transfer_params": None})
    assert reply.status_code == 200
    assert metric(decode.url, "genpool_kv_transfer_fallbacks_total", reason="prefill_failed") == 1
    assert metric(prefill.url, "genpool_kv_transfers_total", side="export") == 0


def test_a_decode_leg_of_one_token_answers_from_the_prefill(worker_factory: Factory) -> None:
    prefill = worker_factory(role="prefill")
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url))
    answer, reply = sidecar_exchange(prefill.url, decode.url, "/v1/completions",
                                     COMPLETION | {"max_tokens": 1})  # fmt: skip
    assert reply.status_code == 200
    assert text_of(reply.json()) == text_of(answer)
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    wait_no_held_kv(prefill.url)
    wait_no_held_kv(decode.url)
