"""The P/D surface is closed (docs/operations.md#threat-model): a client's header or
handle never makes a worker contact an endpoint the pool does not know; KV pulls and
cancels need the pool's secret; a handle's first token is checked; n choices and prompt
lists share one export per prompt; pulled KV is capped (a 503 past the cap)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.worker.conftest import RunningWorker
from tests.worker.pd_support import (
    endpoint,
    metric,
    sidecar_exchange,
    sidecar_prefill_body,
    wait_no_held_kv,
)

Factory = Callable[..., RunningWorker]
BODY = {"prompt": "The quick brown fox jumps over the lazy dog. " * 4, "max_tokens": 10}
LISTS = {"prompt": ["The first of two prompts, a long one.", "And the second prompt."],
         "n": 2, "max_tokens": 10}  # fmt: skip


class Listener:
    """A TCP port that counts the connections made to it (a target a client chose)."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self.num_connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.num_connections += 1
            conn.close()

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    target = Listener()
    yield target
    target.close()


def texts(reply: dict[str, Any]) -> list[str]:
    return [c.get("text", c.get("message", {}).get("content")) for c in reply["choices"]]


def test_a_clients_prefiller_header_is_not_followed(
    worker_factory: Factory, listener: Listener
) -> None:
    # Before issue 33 a plain worker POSTed the client's whole body to this address.
    worker = worker_factory()
    header = {"x-prefiller-host-port": f"127.0.0.1:{listener.port}"}
    reply = worker.client().post("/v1/completions", json=BODY, headers=header)
    assert reply.status_code == 200, reply.text
    assert listener.num_connections == 0
    assert metric(worker.url, "genpool_kv_transfer_fallbacks_total", reason="untrusted") == 1


def test_a_handle_naming_another_host_is_not_pulled(
    worker_factory: Factory, listener: Listener
) -> None:
    # Before issue 33 the decode worker sent GET (and DELETE) /v1/kv/... to any host.
    prefill = worker_factory(role="prefill")
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url))
    leg = prefill.client().post("/v1/completions", json=sidecar_prefill_body(BODY)).json()
    params = leg["kv_transfer_params"]
    forged = params | {"genpool": params["genpool"] | {"port": listener.port}}
    reply = decode.client().post("/v1/completions", json=BODY | {"kv_transfer_params": forged})
    assert reply.status_code == 200, reply.text
    assert listener.num_connections == 0
    assert metric(decode.url, "genpool_kv_transfer_fallbacks_total", reason="untrusted") == 1


def test_kv_pulls_and_cancels_need_the_pools_secret(worker_factory: Factory) -> None:
    prefill = worker_factory(role="prefill", kv_secret="pool-secret")
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url),
                            kv_secret="pool-secret")  # fmt: skip
    colocated = worker_factory()
    leg = prefill.client().post("/v1/completions", json=sidecar_prefill_body(BODY)).json()
    kv = f"{prefill.url}/v1/kv/{leg['kv_transfer_params']['genpool']['transfer_id']}"
    assert httpx.get(kv).status_code == 401
    assert httpx.delete(kv, headers={"authorization": "Bearer guess"}).status_code == 403
    assert httpx.delete(kv, headers={"authorization": "Bearer pool-secret"}).status_code == 204
    _, reply = sidecar_exchange(prefill.url, decode.url, "/v1/completions", BODY)
    expected = colocated.client().post("/v1/completions", json=BODY).json()
    assert texts(reply.json()) == texts(expected)
    assert metric(decode.url, "genpool_kv_transfers_total", side="import", outcome="ok") == 1
    wait_no_held_kv(prefill.url)


def test_a_handles_first_token_outside_the_vocabulary_is_refused(worker_factory: Factory) -> None:
    prefill = worker_factory(role="prefill")
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url))
    leg = prefill.client().post("/v1/completions", json=sidecar_prefill_body(BODY)).json()
    params = leg["kv_transfer_params"]
    bad = params | {"genpool": params["genpool"] | {"first_token": 10**6}}
    reply = decode.client().post("/v1/completions", json=BODY | {"kv_transfer_params": bad})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"].startswith("kv_transfer_params.genpool.first_token")


@pytest.mark.parametrize("how", ["own leg", "sidecar"])
def test_n_choices_of_a_prompt_list_share_one_export_per_prompt(
    worker_factory: Factory, how: str
) -> None:
    prefill = worker_factory(role="prefill")
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url))
    expected = texts(worker_factory().client().post("/v1/completions", json=LISTS).json())
    if how == "sidecar":
        answer, reply = sidecar_exchange(prefill.url, decode.url, "/v1/completions", LISTS)
        assert len(answer["kv_transfer_params"]["genpool"]) == 2  # one handle per prompt
    else:
        reply = decode.client().post("/v1/completions", json=LISTS)
    assert reply.status_code == 200, reply.text
    assert texts(reply.json()) == expected and len(expected) == 4
    assert metric(prefill.url, "genpool_kv_transfers_total", side="export", outcome="ok") == 2
    assert metric(decode.url, "genpool_kv_transfers_total", side="import", outcome="ok") == 2
    wait_no_held_kv(prefill.url)
    wait_no_held_kv(decode.url)


def test_pulled_kv_past_the_cap_is_a_503_and_frees_the_export(worker_factory: Factory) -> None:
    prefill = worker_factory(role="prefill")
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url),
                            max_kv_import_bytes=1000)  # fmt: skip
    _, reply = sidecar_exchange(prefill.url, decode.url, "/v1/completions", BODY)
    assert reply.status_code == 503, reply.text
    assert "--max-kv-import-bytes" in reply.json()["error"]["message"]
    assert reply.headers["retry-after"]
    wait_no_held_kv(prefill.url)  # cancelled, not left to expire
    assert metric(prefill.url, "genpool_kv_transfers_total", side="export",
                  outcome="cancelled") == 1  # fmt: skip
