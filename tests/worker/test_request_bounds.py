"""Issue 33's findings at the edge (docs/worker.md#http-api): every numeric field of a body
bounded, with a 422 naming the field; vLLM's semantics where they are the convention
(greedy below a temperature of 1e-5); ``stream_options`` on ``/v1/completions``. Each
request that was refused leaves the worker serving the next one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from genpool_core.ttft_histogram import bucket_of
from genpool_worker.arrival_key import ARRIVAL_HEADER
from tests.worker.conftest import RunningWorker
from tests.worker.pd_support import metric

Factory = Callable[..., RunningWorker]
PROMPT = {"prompt": "x", "max_tokens": 4}
# (body fields, the field the 422 names): each one a 500 and a dead engine before issue 33.
OUT_OF_RANGE: list[tuple[dict[str, Any], str]] = [
    ({"temperature": 1, "top_k": 9223372036854775808}, "top_k"),
    ({"temperature": 1, "top_k": 10**400}, "top_k"),
    ({"temperature": 1, "repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"max_tokens": 10**400}, "max_tokens"),
    ({"min_tokens": 10**400}, "min_tokens"),
    ({"seed": 2**64}, "seed"),
    ({"prompt": [2**63]}, "prompt"),
    ({"genpool": {"arrival_time": 1e400}}, "genpool.arrival_time"),
]


def healthy_after(worker: RunningWorker) -> None:
    with worker.client() as client:
        assert client.get("/health").status_code == 200
        plain = client.post("/v1/completions", json=PROMPT, timeout=10)
        assert plain.status_code == 200, plain.text


@pytest.mark.parametrize(("fields", "named"), OUT_OF_RANGE)
def test_an_out_of_range_field_is_a_422_naming_it(
    worker_factory: Factory, fields: dict[str, Any], named: str
) -> None:
    worker = worker_factory()
    # json.dumps writes 1e400 as Infinity; a number that long is what a client could send.
    raw = json.dumps(PROMPT | fields).replace("Infinity", "1" + "0" * 400)
    with worker.client() as client:
        reply = client.post(
            "/v1/completions", content=raw, headers={"content-type": "application/json"}
        )
    assert reply.status_code == 422, reply.text
    assert named in reply.json()["error"]["message"]
    healthy_after(worker)


def test_a_temperature_below_1e_5_is_greedy(worker_factory: Factory) -> None:
    worker = worker_factory()
    with worker.client() as client:
        greedy = client.post("/v1/completions", json=PROMPT | {"temperature": 0}).json()
        for tiny in (1e-39, 1e-6):
            reply = client.post("/v1/completions", json=PROMPT | {"temperature": tiny})
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["text"] == greedy["choices"][0]["text"]


def test_stream_options_on_completions_adds_the_usage_chunk(worker_factory: Factory) -> None:
    # OpenAI's API and llm-d's sidecar send stream_options on /v1/completions too.
    worker = worker_factory()
    body = PROMPT | {"stream": True, "stream_options": {"include_usage": True}}
    with worker.client() as client:
        reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == PROMPT["max_tokens"]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"])


def test_an_arrival_stamp_cannot_jump_further_than_the_max_age(worker_factory: Factory) -> None:
    # {"genpool": {"arrival_time": 0}} went to the head of the queue, was at risk at once
    # and set the stat line's ttft_p90 to the age of the Unix epoch (issue 33).
    worker = worker_factory(max_arrival_age_s=2.0)
    with worker.client() as client:
        forged = client.post("/v1/completions", json=PROMPT | {"genpool": {"arrival_time": 0}})
        assert forged.status_code == 200, forged.text
        header = {ARRIVAL_HEADER: f"{time.time() - 0.5:.3f}"}  # a router's, outranking the body
        routed = client.post("/v1/completions", json=PROMPT | {"genpool": {"arrival_time": 0}},
                             headers=header)  # fmt: skip
        assert routed.status_code == 200, routed.text
    counts = worker.engine.snapshot.stats.ttft_counts
    assert sum(counts) == 2
    assert sum(counts[bucket_of(2.0 + 1.0) + 1 :]) == 0, counts  # no TTFT past the bound
    assert metric(worker.url, "genpool_arrival_keys_total", source="body", clamped="true") == 1
    assert metric(worker.url, "genpool_arrival_keys_total", source="header", clamped="false") == 1
