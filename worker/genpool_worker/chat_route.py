"""``POST /v1/chat/completions`` and ``GET /v1/models``: the chat is rendered with the
model's own template (chat_template.py), then served like a completion; replies and
stream chunks take OpenAI's chat shapes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from genpool_worker.api import ChatCompletionRequest, StreamOptions
from genpool_worker.chat_template import ChatTemplateError
from genpool_worker.choices import Choices, Collected, check_model, running_usage, start_choices
from genpool_worker.events import TokenDelta, Usage
from genpool_worker.generation import End, PiecesResponse, reply_fields
from genpool_worker.http_common import ApiError, ServerContext, context_of, read_json, sse
from genpool_worker.logprobs_format import chat_logprobs

router = APIRouter()
STARTED = int(time.time())  # ``created`` of the served model
OWNER = "genpool"


@router.get("/v1/models")
async def models(request: Request) -> Response:
    info = context_of(request).engine.model_info
    card = {"id": info.name, "object": "model", "created": STARTED, "owned_by": OWNER,
            "max_model_len": info.max_seq_len}  # fmt: skip
    return JSONResponse({"object": "list", "data": [card]})


def chat_prompt_ids(context: ServerContext, body: ChatCompletionRequest) -> list[int]:
    """The chat's prompt: its messages through the model's template (a 400 when the
    template refuses them); what ``/v1/chat/completions/render`` answers too."""
    try:
        return context.chat.prompt_ids([m.as_template_input() for m in body.messages])
    except ChatTemplateError as exc:
        raise ApiError(400, f"messages: {exc}") from None


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    context = context_of(request)
    body = await read_json(request, ChatCompletionRequest, limits=context.edge_limits)
    check_model(context, body.model)
    ids = chat_prompt_ids(context, body)
    max_seq_len = context.engine.model_info.max_seq_len
    max_tokens = body.length_limit() or max(1, max_seq_len - len(ids))
    choices = await start_choices(context, body, [ids], lambda _: max_tokens, request,
                                  id_prefix="chatcmpl")  # fmt: skip
    reply = _Reply(context, body, choices)
    if body.stream:
        return PiecesResponse(stream(reply, body.stream_options), choices)
    return await collect(reply, request)


class _Reply:
    """The fields every object of one reply repeats."""

    def __init__(
        self, context: ServerContext, body: ChatCompletionRequest, choices: Choices
    ) -> None:
        self.context, self.body, self.choices = context, body, choices
        self.request_id, self.created = choices.request_id, int(time.time())
        self.model = context.engine.model_info.name  # what /v1/models lists

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": kind, "created": self.created,
                "model": self.model}  # fmt: skip

    def logprobs(self, tokens: Any) -> dict[str, Any] | None:
        if not self.body.logprobs:
            return None
        return chat_logprobs(self.context.tokenizer, tokens)

    def chunk(self, index: int, delta: dict[str, str], finish: str | None = None,
              tokens: Any = ()) -> dict[str, Any]:  # fmt: skip
        choice = {"index": index, "delta": delta, "finish_reason": finish,
                  "logprobs": self.logprobs(tokens) if tokens else None}  # fmt: skip
        return self.head("chat.completion.chunk") | {"choices": [choice]}


def _usage(ends: list[End]) -> dict[str, Any]:
    """The prompt once (the n choices share it), every choice's output."""
    first = ends[0].usage
    completion = sum(e.usage.completion_tokens for e in ends)
    return Usage(first.prompt_tokens, completion, first.cached_tokens).as_dict()


async def stream(reply: _Reply, options: StreamOptions | None) -> AsyncIterator[bytes]:
    """Each choice's role first, then content deltas, then its finish reason (the last
    with the usage), ``[DONE]``. ``stream_options.include_usage`` adds OpenAI's usage-only
    chunk before ``[DONE]``; ``continuous_usage_stats`` puts each choice's usage so far in
    its every chunk (vLLM's)."""
    include_usage = options is not None and options.include_usage
    continuous = options is not None and options.continuous_usage_stats
    ends: list[End] = []
    try:
        for index in range(len(reply.choices.started)):
            yield sse(reply.chunk(index, {"role": "assistant", "content": ""})).encode()
        async for index, piece in reply.choices.stream():
            if isinstance(piece, TokenDelta):
                chunk = reply.chunk(index, {"content": piece.text}, tokens=piece.logprobs)
                if continuous:
                    chunk["usage"] = running_usage(reply.choices, index, piece)
                yield sse(chunk).encode()
                continue
            ends.append(piece)
            chunk = reply.chunk(index, {}, piece.finish_reason)
            if len(ends) < len(reply.choices.started):
                yield sse(chunk).encode()
                continue
            usage = {"usage": _usage(ends)}
            text = sse(chunk | usage)
            if include_usage:
                text += sse(reply.head("chat.completion.chunk") | {"choices": []} | usage)
            yield text.encode()
        yield b"data: [DONE]\n\n"
    except ApiError as exc:
        yield sse({"error": {"message": exc.message, "type": exc.kind}}).encode()


async def collect(reply: _Reply, request: Request) -> Response:
    results: list[Collected] = await reply.choices.collect()
    choices = []
    for index, result in enumerate(results):
        assert result.end is not None
        message = {"role": "assistant", "content": result.text}
        choices.append({"index": index, "message": message,
                        "finish_reason": result.end.finish_reason,
                        "logprobs": reply.logprobs(result.logprobs)})  # fmt: skip
    body = reply.head("chat.completion") | {"choices": choices}
    body["usage"] = _usage([r.end for r in results if r.end])
    extra = reply_fields(reply.context, request, reply.choices.started)
    return JSONResponse(body | extra)
