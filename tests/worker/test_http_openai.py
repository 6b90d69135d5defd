"""OpenAI chat completions, models, stop strings, JSON errors for every path and the
model-server gauges, against a real worker on loopback (synthetic model)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import httpx
import pytest
from fastapi.testclient import TestClient

from genpool_core.stats import SchedulerStats
from genpool_worker.metrics import (
    CACHE_CONFIG_INFO,
    KV_CACHE_USAGE_PERC,
    KV_CACHE_USAGE_PERC_OLD,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    WorkerMetrics,
)
from genpool_worker.server import create_app
from genpool_worker.slo_request import TPOT_HEADER, TTFT_HEADER
from tests.polling import wait_for, wait_for_async
from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12}


def sse_events(raw: str) -> list[dict[str, object]]:
    chunks = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


def gauge(metrics: str, name: str) -> float:
    lines = [ln for ln in metrics.splitlines() if ln.startswith(name + "{")]
    assert len(lines) == 1, (name, lines)
    return float(lines[0].rsplit(" ", 1)[1])


def test_chat_completion_has_openai_shape_and_usage(worker_factory: Factory) -> None:
    worker = worker_factory()
    with worker.client() as client:
        reply = client.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        assert body["model"] == "synthetic:test"
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
        assert len(choice["message"]["content"]) == 12
        prompt = len("user: hello\nassistant:")  # the synthetic fallback template, 1 byte a token
        assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 12,
                                 "total_tokens": prompt + 12,
                                 "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
        parts = {"role": "user", "content": [{"type": "text", "text": "hel"},
                                             {"type": "text", "text": "lo"}]}  # fmt: skip
        same = client.post("/v1/chat/completions",
                           json={"messages": [parts], "max_completion_tokens": 12})  # fmt: skip
        assert same.json()["choices"][0]["message"]["content"] == choice["message"]["content"]
        sdk = {"n": 1, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0.0}
        assert client.post("/v1/chat/completions", json=CHAT | sdk).status_code == 200
        models = client.get("/v1/models").json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["synthetic:test"]
        assert models["data"][0]["object"] == "model"


def test_chat_stream_sends_role_then_content_then_finish_then_done(
    worker_factory: Factory,
) -> None:
    worker = worker_factory()
    with worker.client() as client:
        body = CHAT | {"stream": True, "stream_options": {"include_usage": True}}
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = sse_events(reply.text)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]  # type: ignore[index]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(set(d) == {"content"} for d in deltas[1:-1])
    assert len("".join(d["content"] for d in deltas[1:-1])) == 12
    finish = events[-2]
    assert deltas[-1] == {} and finish["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert finish["usage"]["completion_tokens"] == 12  # type: ignore[index]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == finish["usage"]


def test_stop_strings_truncate_text_and_finish_with_stop(worker_factory: Factory) -> None:
    worker = worker_factory()
    with worker.client() as client:
        free = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 40}).json()
        text = free["choices"][0]["text"]
        stop = text[10:13]  # spans token boundaries: one byte per token here
        before = text[: text.find(stop)]
        body = {"prompt": "ab", "max_tokens": 40, "stop": [stop, "never-seen"]}
        cut = client.post("/v1/completions", json=body).json()
        assert cut["choices"][0]["text"] == before
        assert cut["choices"][0]["finish_reason"] == "stop"
        # The engine finished it as a stop: no token after the match, not an abort.
        assert cut["usage"]["completion_tokens"] == free["usage"]["completion_tokens"] - (
            len(text) - len(before) - len(stop)
        )
        streamed = client.post("/v1/completions", json=body | {"stream": True})
        events = sse_events(streamed.text)
        assert "".join(e["choices"][0]["text"] for e in events) == before  # type: ignore[index]
        assert events[-1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
        chat = client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 40, "stop": "zzzz"})
        assert chat.json()["choices"][0]["finish_reason"] == "length"  # no match: untouched
    wait_for(lambda: worker.engine.inflight == 0, "a stopped request to free its slot", 30)
    assert worker.engine.snapshot.stats.aborted == 0  # stops count as completions


def test_every_error_is_our_json_shape(worker_factory: Factory) -> None:
    worker = worker_factory()
    with worker.client() as client:
        missing = client.get("/v1/nothing")
        assert missing.status_code == 404
        assert missing.json()["error"] == {"message": "no route GET /v1/nothing",
                                           "type": "not_found_error", "code": 404}  # fmt: skip
        wrong = client.get("/v1/chat/completions")
        assert wrong.status_code == 405 and wrong.json()["error"]["code"] == 405
        assert "POST" in wrong.headers["allow"]
        assert client.delete("/v1/models").json()["error"]["code"] == 405
        for body in BAD_CHATS:
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code in (400, 422), (body, reply.text)
            assert set(reply.json()["error"]) == {"message", "type", "code"}
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


BAD_CHATS: list[object] = [
    {}, {"messages": []}, {"messages": "hi"}, {"messages": [{"role": "user"}]},
    {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]},
    {"messages": [{"role": "user", "content": 5}]},
    CHAT | {"max_tokens": 0}, CHAT | {"max_completion_tokens": -1},
    CHAT | {"max_tokens": 5, "max_completion_tokens": 6}, CHAT | {"max_tokens": 10**6},
    CHAT | {"stop": ["a", "b", "c", "d", "e"]}, CHAT | {"stop": [""]}, CHAT | {"stop": 5},
    CHAT | {"stream_options": {"include_usage": "yes"}}, CHAT | {"n": 17}, CHAT | {"top_p": 0},
    CHAT | {"frequency_penalty": 3}, CHAT | {"top_logprobs": 2}, CHAT | {"tools": []},
    CHAT | {"temperature": 3}, CHAT | {"slo": {"ttft_ms": -1}}, CHAT | {"slo": 5},
]  # fmt: skip


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_slo_headers_are_checked_on_both_endpoints(worker_factory: Factory, path: str) -> None:
    worker = worker_factory()
    body = CHAT if "chat" in path else {"prompt": "hi", "max_tokens": 3}
    with worker.client() as client:
        good = client.post(path, json=body, headers={TTFT_HEADER: "500", TPOT_HEADER: "20"})
        assert good.status_code == 200, good.text
        with_body = client.post(path, json=body | {"slo": {"ttft_ms": 500, "tpot_ms": 20}})
        assert with_body.status_code == 200, with_body.text
        bad = client.post(path, json=body, headers={TPOT_HEADER: "nan"})
        assert bad.status_code == 400 and TPOT_HEADER in bad.json()["error"]["message"]
        bad = client.post(path, json=body | {"slo": {"ttft_ms": 0}})
        assert bad.status_code == 400 and "slo.ttft_ms" in bad.json()["error"]["message"]


def testmodel_server_gauges_count_queued_and_resident_requests(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=1, resident_headroom=1)

    async def scenario() -> tuple[str, list[httpx.Response]]:
        async with worker.async_client() as client:
            body = {"prompt": "a", "max_tokens": 150}
            work = [asyncio.create_task(client.post("/v1/completions", json=body))
                    for _ in range(3)]  # fmt: skip

            async def all_three_in() -> str | None:
                text = (await client.get("/metrics")).text
                both = gauge(text, NUM_REQUESTS_RUNNING) + gauge(text, NUM_REQUESTS_WAITING)
                return text if both == 3 else None

            # One decodes, one holds the headroom slot, one waits.
            metrics = await wait_for_async(all_three_in, "the gauges to count all 3", 30)
            return metrics, list(await asyncio.gather(*work))

    metrics, replies = asyncio.run(scenario())
    assert [r.status_code for r in replies] == [200] * 3
    running = gauge(metrics, NUM_REQUESTS_RUNNING)
    waiting = gauge(metrics, NUM_REQUESTS_WAITING)
    assert running + waiting == 3 and 1 <= running <= 2
    # Each resident holds the blocks of 1 prompt + 150 output tokens (16-token blocks); the
    # default cache holds B + H = 2 requests of max_seq_len 2048.
    info = re.search(r'cache_config_info\{block_size="(\d+)",num_gpu_blocks="(\d+)"\}', metrics)
    assert info is not None and info.groups() == ("16", str(2 * 2048 // 16))
    assert gauge(metrics, KV_CACHE_USAGE_PERC) == running * 10 / 256
    assert gauge(metrics, KV_CACHE_USAGE_PERC_OLD) == gauge(metrics, KV_CACHE_USAGE_PERC)
    assert f'{NUM_REQUESTS_RUNNING}{{model_name="synthetic:test"}}' in metrics
    with worker.client() as client:
        idle = client.get("/metrics").text
    assert gauge(idle, NUM_REQUESTS_RUNNING) == 0 == gauge(idle, KV_CACHE_USAGE_PERC)
    assert "genpool_queue_length{" in idle  # our own series stay


def test_paused_residents_count_as_running_and_hold_kv() -> None:
    metrics = WorkerMetrics("m", is_synthetic=True)
    metrics.kv_block_size = 16
    stats = SchedulerStats(t=0.0, mode="target_output_tps", target_output_tps=5.0,
                           residents=3, active=2, paused=1, paused_cap=2,
                           resident_headroom=2, waiters=4, at_risk=0,
                           admission_target_s=None, kv_blocks=40, kv_blocks_used=30,
                           kv_blocks_paused=10)  # fmt: skip
    families = {m.name: m.samples[0] for m in metrics.model_server_gauges(stats)}
    values = {name: sample.value for name, sample in families.items()}
    assert values[NUM_REQUESTS_RUNNING] == 3 and values[NUM_REQUESTS_WAITING] == 4
    # Blocks held (the paused request's included) over the worker's blocks.
    assert values[KV_CACHE_USAGE_PERC] == 0.75 == values[KV_CACHE_USAGE_PERC_OLD]
    assert families[CACHE_CONFIG_INFO].labels == {"block_size": "16", "num_gpu_blocks": "40"}


def test_a_chat_client_that_disconnects_frees_its_slot(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=2)
    body = CHAT | {"max_tokens": 500, "stream": True}
    with worker.client() as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            for _ in reply.iter_lines():
                break  # the role chunk: accepted, then gone
        wait_for(lambda: worker.engine.inflight == 0, "the chat request to free its slot", 30)


class BrokenTokenizer:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        raise RuntimeError("tokenizer bug")

    def decode(self, ids: list[int]) -> str:
        return ""


def test_an_unexpected_exception_is_a_json_500(worker_factory: Factory) -> None:
    engine = worker_factory().engine
    metrics = WorkerMetrics("synthetic:test", is_synthetic=True)
    app = create_app(engine, BrokenTokenizer(), metrics)
    with TestClient(app, raise_server_exceptions=False) as client:
        reply = client.post("/v1/completions", json={"prompt": "x"})
    assert reply.status_code == 500
    assert reply.json()["error"] == {"message": "internal error: RuntimeError",
                                     "type": "internal_error", "code": 500}  # fmt: skip
