"""Sampling and logprobs on real SmolLM2-135M weights, through the ``openai`` SDK: seeded
top-p sampling reproducible and different from greedy, logprobs of greedy tokens the
best of their alternatives, and ``n`` seeded choices differing from each other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]
PROMPT = "Once upon a time, in a small village,"


def test_seeded_sampling_and_logprobs_on_smollm2(worker_factory: Factory) -> None:
    worker = worker_factory(model="smollm2-135m", max_batch_size=4, max_seq_len=512)
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id

    def complete(**knobs: object) -> openai.types.Completion:
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=16, **knobs)  # type: ignore[call-overload, no-any-return]

    greedy = complete(logprobs=3)
    sampled = [complete(temperature=1.0, top_p=0.9, seed=11).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1] != greedy.choices[0].text
    logprobs = greedy.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs and logprobs.token_logprobs
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen is not None and abs(chosen - max(top.values())) < 1e-4  # greedy: the best
    choices = complete(temperature=1.0, seed=5, n=3).choices
    assert len({c.text for c in choices}) > 1  # seed + j per choice
    penalised = complete(frequency_penalty=2.0, extra_body={"repetition_penalty": 1.5})
    assert penalised.choices[0].text != greedy.choices[0].text


def test_ignore_eos_and_min_tokens_on_smollm2(worker_factory: Factory) -> None:
    # A short chat answer ends with EOS long before its limit; ignore_eos decodes on to the
    # limit, and min_tokens keeps EOS masked until that many tokens are out (vLLM's rule).
    worker = worker_factory(model="smollm2-135m", max_batch_size=2, max_seq_len=512)
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages: Any = [{"role": "user", "content": "Say hi."}]

    def chat(**knobs: object) -> Any:
        return client.chat.completions.create(model=model, messages=messages, max_tokens=64,
                                              temperature=0, **knobs)  # fmt: skip

    short = chat()
    assert short.choices[0].finish_reason == "stop" and short.usage is not None
    ends_at = short.usage.completion_tokens
    assert ends_at < 64
    forced = chat(extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length" and forced.usage is not None
    assert forced.usage.completion_tokens == 64
    held = chat(extra_body={"min_tokens": ends_at + 5})
    assert held.usage is not None and held.usage.completion_tokens >= ends_at + 5
