"""The OpenAI surface clients send (docs/worker.md#http-api), through the ``openai`` SDK:
sampling knobs, ``n``, a list of prompts, ``echo``, ``logprobs`` (completions and chat,
streamed too), ``min_tokens`` / ``ignore_eos`` / ``stop_token_ids``, an unknown model's 404,
and what stays unsupported refused with a message that says so."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from tests.worker.pd_support import metric
from tests.worker.sdk_support import HELLO, MODEL, Factory, sdk


def test_sampling_knobs_are_accepted_and_seeded(worker_factory: Factory) -> None:
    client = sdk(worker_factory())
    knobs = dict(model=MODEL, prompt="hello", max_tokens=8, temperature=0.8, top_p=0.9, seed=3,
                 frequency_penalty=0.5, presence_penalty=0.2,
                 extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1})  # fmt: skip
    first = client.completions.create(**knobs)  # type: ignore[call-overload]
    again = client.completions.create(**knobs)  # type: ignore[call-overload]
    assert first.choices[0].text == again.choices[0].text and first.usage.completion_tokens == 8


def test_n_choices_of_each_prompt(worker_factory: Factory) -> None:
    worker = worker_factory()
    client = sdk(worker)
    # 43 and 50 tokens (the synthetic model's text follows each prompt's last token):
    # two and three full blocks of 16, one token always left to compute
    prompts = ["hello " * 7 + "a", "world! " * 7 + "b"]
    reply = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4)
    # submitted together, admitted in one pass: each prompt's second choice holds the
    # first one's two full blocks (the prefix cache) instead of prefilling them again
    assert metric(worker.url, "vllm:prefix_cache_hits_total") == 32 + 48
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    texts = [c.text for c in reply.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3] and texts[0] != texts[2]  # greedy
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (93, 16)
    assert reply.usage.prompt_tokens_details.cached_tokens == 0  # each prompt computed once
    again = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4)
    assert [c.text for c in again.choices] == texts
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 32 + 48
    chat = client.chat.completions.create(model=MODEL, messages=HELLO, n=3, max_tokens=5)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert chat.usage is not None and chat.usage.completion_tokens == 15


def test_streamed_choices_are_interleaved_and_whole(worker_factory: Factory) -> None:
    client = sdk(worker_factory())
    whole = client.completions.create(model=MODEL, prompt=["ab", "cd"], max_tokens=6)
    texts = ["", ""]
    finishes: dict[int, str | None] = {}
    usage = None
    for chunk in client.completions.create(model=MODEL, prompt=["ab", "cd"], max_tokens=6,
                                           stream=True):  # fmt: skip
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices]
    assert finishes == {0: "length", 1: "length"} and usage is not None
    assert usage.completion_tokens == 12


def test_guidellms_stream_options_give_usage_in_every_chunk(worker_factory: Factory) -> None:
    """What guidellm sends (vLLM's ``continuous_usage_stats``, ``stop: null``,
    ``ignore_eos``) is served: every content chunk carries its usage so far, and the
    usage-only chunk closes the stream (chat and completions)."""
    worker = worker_factory()
    options = {"include_usage": True, "continuous_usage_stats": True}
    extra = {"stream_options": options, "stop": None, "ignore_eos": True}
    http = httpx.Client(base_url=worker.url, timeout=30)
    for path, body in (
        ("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 6}),
        ("/v1/chat/completions", {"model": MODEL, "messages": HELLO,
                                  "max_completion_tokens": 6}),
    ):  # fmt: skip
        with http.stream("POST", path, json={**body, **extra, "stream": True}) as response:
            assert response.status_code == 200, response.read()
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: {")]  # fmt: skip
        counts = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")]
        assert counts == sorted(counts) and counts[-1] == 6, (path, counts)
        content = [c for c in chunks if c["choices"] and _text_of(c["choices"][0])]
        assert content and all(c.get("usage") for c in content), path
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def _text_of(choice: dict[str, object]) -> object:
    delta = choice.get("delta")
    return delta.get("content") if isinstance(delta, dict) else choice.get("text")


def test_echo_puts_the_prompt_first(worker_factory: Factory) -> None:
    client = sdk(worker_factory())
    plain = client.completions.create(model=MODEL, prompt="hello", max_tokens=4)
    echoed = client.completions.create(model=MODEL, prompt="hello", max_tokens=4, echo=True)
    assert echoed.choices[0].text == "hello" + plain.choices[0].text


def test_completion_logprobs_in_openai_shape(worker_factory: Factory) -> None:
    client = sdk(worker_factory())
    reply = client.completions.create(model=MODEL, prompt="hello", max_tokens=5, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset == [0, 1, 2, 3, 4]
    assert logprobs.top_logprobs is not None and all(len(t) == 2 for t in logprobs.top_logprobs)
    assert all(v is not None and v <= 0 for v in logprobs.token_logprobs or [])
    streamed = []
    for chunk in client.completions.create(model=MODEL, prompt="hello", max_tokens=5, logprobs=2,
                                           stream=True):  # fmt: skip
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.tokens or []
    assert streamed == logprobs.tokens


def test_chat_logprobs_in_openai_shape(worker_factory: Factory) -> None:
    client = sdk(worker_factory())
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4,
                                           logprobs=True, top_logprobs=3)  # fmt: skip
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content)
    assert all(math.isclose(t.logprob, t.top_logprobs[0].logprob) for t in content)  # greedy
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_stop_tokens_min_tokens_and_ignore_eos(worker_factory: Factory) -> None:
    client = sdk(worker_factory())
    free = client.completions.create(model=MODEL, prompt="hello", max_tokens=8).choices[0]
    stop_id = ord(free.text[2])  # the synthetic tokenizer's ids are bytes
    stops = {"stop_token_ids": [stop_id]}
    cut = client.completions.create(model=MODEL, prompt="hello", max_tokens=8,
                                    extra_body=stops).choices[0]  # fmt: skip
    assert (cut.text, cut.finish_reason) == (free.text[:2], "stop")
    late = client.completions.create(model=MODEL, prompt="hello", max_tokens=8,
                                     extra_body={"stop_token_ids": [stop_id], "min_tokens": 4,
                                                 "ignore_eos": True}).choices[0]  # fmt: skip
    assert late.finish_reason in ("stop", "length") and len(late.text) >= 3


def test_an_unknown_model_is_a_404_and_the_ids_agree(worker_factory: Factory) -> None:
    client = sdk(worker_factory())
    with pytest.raises(openai.NotFoundError, match="gpt-4"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=HELLO, max_tokens=2)
    (card,) = client.models.list().data
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).model == card.id


@pytest.mark.parametrize(
    ("extra", "said"),
    [({"response_format": {"type": "json_object"}}, "structured output is not supported"),
     ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool calling"),
     ({"logit_bias": {"1": 5}}, "logit_bias is not supported")],
)  # fmt: skip
def test_what_stays_unsupported_says_so(worker_factory: Factory, extra: dict[str, object],
                                        said: str) -> None:  # fmt: skip
    client = sdk(worker_factory())
    with pytest.raises(openai.UnprocessableEntityError, match=said):
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, extra_body=extra)
    with pytest.raises(openai.UnprocessableEntityError, match="echo with logprobs"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, echo=True, logprobs=1)
