"""``POST /v1/completions``: validate, submit each prompt's ``n`` choices to the engine,
serialize their text pieces (one JSON body, or server-sent events when ``stream`` is set),
with ``echo`` and ``logprobs`` in OpenAI's shapes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from genpool_worker.api import CompletionRequest
from genpool_worker.choices import (
    Choices,
    Collected,
    check_model,
    running_usage,
    start_choices,
)
from genpool_worker.events import TokenDelta, Usage
from genpool_worker.generation import End, PiecesResponse, reply_fields
from genpool_worker.http_common import ApiError, ServerContext, context_of, read_json, sse
from genpool_worker.logprobs_format import completion_logprobs

router = APIRouter()


def prompt_ids(context: ServerContext, prompt: str | list[int]) -> list[int]:
    """Token ids as given (the edge checked them against the vocabulary), or encoded."""
    return context.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)


class _Reply:
    """What every object of one reply repeats, and each choice's running text offset."""

    def __init__(self, context: ServerContext, body: CompletionRequest, choices: Choices) -> None:
        self.context, self.body, self.choices = context, body, choices
        self.request_id = choices.request_id
        self.model = context.engine.model_info.name  # what /v1/models lists
        self.created = int(time.time())
        self.offsets = [0] * len(choices.started)
        options = body.stream_options
        self.include_usage = options is not None and options.include_usage
        self.continuous_usage = options is not None and options.continuous_usage_stats

    def echo(self, index: int) -> str:
        """The prompt text ``echo`` puts before the choice's text ("" without echo)."""
        if not self.body.echo:
            return ""
        return self.context.tokenizer.decode(self.choices.started[index].arrival.prompt_ids)

    def choice(self, index: int, text: str, tokens: Any, finish: str | None) -> dict[str, Any]:
        logprobs = None
        if self.body.logprobs is not None:
            logprobs = completion_logprobs(self.context.tokenizer, tokens, self.offsets[index])
        self.offsets[index] += len(text)
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}

    def body_of(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.request_id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices}  # fmt: skip


def total_usage(choices: Choices, ends: list[End], n: int) -> dict[str, Any]:
    """Each prompt's tokens once (its ``n`` choices share it; its first choice's cached
    count), every choice's output."""
    prompt_tokens = sum(len(started.arrival.prompt_ids) for started in choices.started[::n])
    completion = sum(end.usage.completion_tokens for end in ends)
    cached = sum(end.usage.cached_tokens for end in ends[::n])
    return Usage(prompt_tokens, completion, cached).as_dict()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    context = context_of(request)
    body = await read_json(request, CompletionRequest, limits=context.edge_limits)
    check_model(context, body.model)
    prompts = [prompt_ids(context, prompt) for prompt in body.prompts()]
    choices = await start_choices(context, body, prompts, lambda ids: body.max_tokens, request,
                                  id_prefix="cmpl")  # fmt: skip
    reply = _Reply(context, body, choices)
    if body.stream:
        return PiecesResponse(stream(reply), choices)
    return await collect(reply, request)


async def stream(reply: _Reply) -> AsyncIterator[bytes]:
    """Each choice's echo first, then its pieces; the last finish carries the usage."""
    ends: list[End] = []
    try:
        for index in range(len(reply.choices.started)):
            if echo := reply.echo(index):
                yield sse(reply.body_of([reply.choice(index, echo, (), None)])).encode()
        async for index, piece in reply.choices.stream():
            if isinstance(piece, TokenDelta):
                choice = reply.choice(index, piece.text, piece.logprobs, None)
                body = reply.body_of([choice])
                if reply.continuous_usage:  # vLLM's continuous_usage_stats
                    body["usage"] = running_usage(reply.choices, index, piece)
                yield sse(body).encode()
                continue
            ends.append(piece)
            chunk = reply.body_of([reply.choice(index, "", (), piece.finish_reason)])
            if len(ends) < len(reply.choices.started):
                yield sse(chunk).encode()
                continue
            usage = {"usage": total_usage(reply.choices, ends, reply.body.n)}
            text = sse(chunk | usage)
            if reply.include_usage:  # OpenAI's usage-only chunk before [DONE]
                text += sse(reply.body_of([]) | usage)
            yield text.encode()
        yield b"data: [DONE]\n\n"
    except ApiError as exc:
        yield sse({"error": {"message": exc.message, "type": exc.kind}}).encode()


async def collect(reply: _Reply, request: Request) -> Response:
    results: list[Collected] = await reply.choices.collect()
    choices = []
    for index, result in enumerate(results):
        assert result.end is not None
        text = reply.echo(index) + result.text
        choices.append(reply.choice(index, text, result.logprobs, result.end.finish_reason))
    body = reply.body_of(choices)
    body["usage"] = total_usage(reply.choices, [r.end for r in results if r.end], reply.body.n)
    extra = reply_fields(reply.context, request, reply.choices.started)
    return JSONResponse(body | extra)
