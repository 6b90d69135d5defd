"""The worker driven by the official OpenAI Python SDK, as real clients drive it: every
OpenAI route, streaming, stop strings, length limits and errors as the SDK's own
exceptions. Synthetic model, real server on loopback. Keying and SLO mode through the SDK:
test_openai_sdk_slo.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest

from genpool_worker.arrival_key import ARRIVAL_HEADER
from genpool_worker.slo_request import TPOT_HEADER, TTFT_HEADER
from tests.worker.sdk_support import (
    HELLO,
    MODEL,
    Factory,
    async_sdk,
    sdk,
    stats_when,
)

# -- the API surface ------------------------------------------------------------------


def test_completions_plain_and_streamed(worker_factory: Factory) -> None:
    with sdk(worker_factory()) as client:
        plain = client.completions.create(model=MODEL, prompt="hello", max_tokens=6)
        assert plain.object == "text_completion" and plain.model == MODEL
        choice = plain.choices[0]
        assert choice.finish_reason == "length" and len(choice.text) == 6
        assert plain.usage is not None
        assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (5, 6)
        assert plain.usage.total_tokens == 11
        chunks = list(client.completions.create(model=MODEL, prompt="hello", max_tokens=6,
                                                stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == choice.text  # greedy: same text
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_chat_plain_and_streamed(worker_factory: Factory) -> None:
    with sdk(worker_factory()) as client:
        plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12)
        assert plain.object == "chat.completion" and plain.id.startswith("chatcmpl-")
        message = plain.choices[0].message
        assert message.role == "assistant" and message.content is not None
        assert len(message.content) == 12 and plain.choices[0].finish_reason == "length"
        assert plain.usage is not None and plain.usage.completion_tokens == 12
        # The new field name, as the SDK's own docs now spell the limit.
        same = client.chat.completions.create(model=MODEL, messages=HELLO,
                                              max_completion_tokens=12)  # fmt: skip
        assert same.choices[0].message.content == message.content
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        ))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the usage-only chunk
    assert chunks[-1].usage.completion_tokens == 12


def test_stop_strings_and_max_tokens(worker_factory: Factory) -> None:
    with sdk(worker_factory()) as client:
        free = client.completions.create(model=MODEL, prompt="ab", max_tokens=40)
        text = free.choices[0].text
        assert free.usage is not None and free.usage.completion_tokens == 40
        stop = text[10:13]
        before = text[: text.find(stop)]
        cut = client.completions.create(model=MODEL, prompt="ab", max_tokens=40,
                                         stop=[stop, "never-seen"])  # fmt: skip
        assert cut.choices[0].text == before and cut.choices[0].finish_reason == "stop"
        assert cut.usage is not None
        assert cut.usage.completion_tokens == len(before) + len(stop)  # one byte a token
        streamed = list(client.completions.create(model=MODEL, prompt="ab", max_tokens=40,
                                                  stop=stop, stream=True))  # fmt: skip
        assert "".join(c.choices[0].text for c in streamed) == before
        assert streamed[-1].choices[0].finish_reason == "stop"

        chat_free = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=30)
        reply = chat_free.choices[0].message.content
        assert reply is not None and chat_free.choices[0].finish_reason == "length"
        chat_stop = reply[5:8]
        chat_cut = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=30,
                                                  stop=chat_stop)  # fmt: skip
        assert chat_cut.choices[0].message.content == reply[: reply.find(chat_stop)]
        assert chat_cut.choices[0].finish_reason == "stop"
        for n in (1, 7):
            short = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=n)
            assert short.usage is not None and short.usage.completion_tokens == n
            assert short.choices[0].finish_reason == "length"
            assert short.choices[0].message.content == reply[:n]


def test_models_list(worker_factory: Factory) -> None:
    with sdk(worker_factory(max_seq_len=1024)) as client:
        models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model" and models.data[0].owned_by == "genpool"
    assert (models.data[0].model_extra or {}).get("max_model_len") == 1024


# (keyword arguments of create, expected exception, text our message must contain)
ERRORS: list[tuple[dict[str, Any], type[openai.APIStatusError], str]] = [
    ({"max_tokens": 5000}, openai.BadRequestError, "exceeds max_seq_len 2048"),
    ({"extra_headers": {TTFT_HEADER: "soon"}}, openai.BadRequestError, TTFT_HEADER),
    ({"extra_headers": {TPOT_HEADER: "0"}}, openai.BadRequestError, TPOT_HEADER),
    ({"extra_headers": {ARRIVAL_HEADER: "yesterday"}}, openai.BadRequestError, ARRIVAL_HEADER),
    ({"extra_headers": {ARRIVAL_HEADER: "-1"}}, openai.BadRequestError, ARRIVAL_HEADER),
    ({"extra_body": {"slo": {"tpot_ms": -5}}}, openai.BadRequestError, "slo.tpot_ms"),
    ({"top_p": 1.5}, openai.UnprocessableEntityError, "top_p"),
    ({"model": "gpt-4"}, openai.NotFoundError, "The model `gpt-4` does not exist"),
    ({"extra_body": {"bogus": 1}}, openai.UnprocessableEntityError, "bogus"),
    ({"extra_headers": {ARRIVAL_HEADER: "FUTURE"}}, openai.UnprocessableEntityError,
     f"{ARRIVAL_HEADER} is"),
    ({"extra_body": {"genpool": {"keyed": False, "arrival_time": 1.0}}},
     openai.UnprocessableEntityError, "genpool.keyed is false but genpool.arrival_time"),
]  # fmt: skip


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_errors_surface_as_the_sdks_exceptions_with_our_message(
    worker_factory: Factory, endpoint: str
) -> None:
    worker = worker_factory()
    with sdk(worker) as client:

        def create(**kw: Any) -> object:
            kw = {"max_tokens": 3, "model": MODEL} | kw
            if endpoint == "chat":
                return client.chat.completions.create(messages=HELLO, **kw)
            return client.completions.create(prompt="hello", **kw)

        for kwargs, expected, text in ERRORS:
            headers = kwargs.get("extra_headers", {})
            if headers.get(ARRIVAL_HEADER) == "FUTURE":  # 60 s ahead: beyond the skew allowed
                kwargs = kwargs | {"extra_headers": {ARRIVAL_HEADER: f"{time.time() + 60:.3f}"}}
            with pytest.raises(openai.APIStatusError) as caught:
                create(**kwargs)
            error = caught.value
            assert type(error) is expected, (kwargs, error)
            assert text in str(error), (kwargs, str(error))
            assert isinstance(error.body, dict) and text in error.body["message"]
            assert error.body["code"] == error.status_code
        create()  # the worker still serves
        # A stamp a little ahead of this clock is within the skew allowed: clamped to now.
        create(extra_headers={ARRIVAL_HEADER: f"{time.time() + 2:.3f}"})
    assert stats_when(worker, "the two served", lambda s: s["completed_total"] == 2)


def test_a_full_queue_is_a_rate_limit_error(worker_factory: Factory) -> None:
    worker = worker_factory(max_batch_size=1, max_queue_length=1)

    async def scenario() -> openai.RateLimitError:
        async with async_sdk(worker) as client:
            running = await client.completions.create(model=MODEL, prompt="a", max_tokens=1000,
                                                      stream=True)  # fmt: skip
            chunks = aiter(running)
            await anext(chunks)  # a token: it holds the one batch slot
            # Accepted (the reply starts once the request is queued): the queue is full.
            queued = await client.completions.create(model=MODEL, prompt="b", max_tokens=2,
                                                     stream=True)  # fmt: skip
            try:
                with pytest.raises(openai.RateLimitError) as caught:
                    await client.completions.create(model=MODEL, prompt="c", max_tokens=2)
            finally:
                await running.close()  # the client leaves: the slot frees, the waiter runs
            last = [c async for c in queued][-1]  # nothing accepted is lost
            assert last.usage is not None and last.usage.completion_tokens == 2
            return caught.value

    error = asyncio.run(scenario())
    assert error.status_code == 429 and "admission queue is full (1 waiters)" in str(error)
    assert error.response.headers["retry-after"] == "1"
