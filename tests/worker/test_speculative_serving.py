"""Speculative decoding served over HTTP: a synthetic worker with n-gram drafts answers
exactly what one without them does (stop strings cut inside an accepted run, ``n``
choices, seeded sampling, logprobs, streaming) and counts what it drafted and accepted
in vLLM's metrics. SmolLM2's greedy text with drafts, across pauses, resumes and chunked
prefill: ``test_prefix_cache_pausing``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from tests.worker.conftest import RunningWorker
from tests.worker.pd_support import metric

Factory = Callable[..., RunningWorker]
SPEC = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
     "prompt_lookup_min": 1}
)  # fmt: skip
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def _complete(client: httpx.Client, **body: Any) -> dict[str, Any]:
    reply = client.post("/v1/completions", json={"model": "synthetic:test", **body})
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


def _streamed(client: httpx.Client, **body: Any) -> str:
    text = ""
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    return text


def test_a_synthetic_worker_answers_the_same_with_drafts(worker_factory: Factory) -> None:
    plain = worker_factory(synthetic_time_scale=0.02)
    drafting = worker_factory(synthetic_time_scale=0.02, speculative_config=SPEC)
    with plain.client() as a, drafting.client() as b:
        base = {"prompt": "speculate on this", "max_tokens": 60}
        want = _complete(a, **base)
        got = _complete(b, **base)
        assert got["choices"] == want["choices"] and got["usage"] == want["usage"]
        text = want["choices"][0]["text"]
        stop = text[33:36]  # ends the text inside a run of accepted drafts
        cut = {**base, "stop": [stop]}
        assert _complete(b, **cut)["choices"] == _complete(a, **cut)["choices"]
        assert _complete(b, **cut)["choices"][0]["finish_reason"] == "stop"
        sampled = {**base, "n": 3, "temperature": 1.0, "seed": 11}
        assert _complete(b, **sampled)["choices"] == _complete(a, **sampled)["choices"]
        with_logprobs = {**base, "logprobs": 2, "max_tokens": 12}
        assert _complete(b, **with_logprobs)["choices"] == _complete(a, **with_logprobs)["choices"]
        assert _streamed(b, **base) == text
    assert metric(drafting.url, ACCEPTED) > 0
    assert metric(drafting.url, "vllm:spec_decode_num_draft_tokens_total") >= metric(
        drafting.url, ACCEPTED
    )
    assert metric(plain.url, ACCEPTED) == 0  # not exported without speculation
