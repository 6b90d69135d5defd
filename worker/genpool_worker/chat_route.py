"""``POST /v1/chat/completions`` and ``GET /v1/models``: the chat is rendered with the
model's own template (chat_template.py), then served like a completion; replies and
stream chunks take OpenAI's chat shapes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from genpool_worker.api import ChatCompletionRequest
from genpool_worker.chat_template import ChatTemplateError
from genpool_worker.generation import (
    End,
    Pieces,
    PiecesResponse,
    Started,
    kv_transfer_fields,
    pieces,
    start,
)
from genpool_worker.http_common import ApiError, context_of, read_json, sse
from genpool_worker.metrics import RequestTimer

router = APIRouter()
STARTED = int(time.time())  # ``created`` of the served model
OWNER = "genpool"


@router.get("/v1/models")
async def models(request: Request) -> Response:
    info = context_of(request).engine.model_info
    card = {"id": info.name, "object": "model", "created": STARTED, "owned_by": OWNER,
            "max_model_len": info.max_seq_len}  # fmt: skip
    return JSONResponse({"object": "list", "data": [card]})


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    context = context_of(request)
    body = await read_json(request, ChatCompletionRequest)
    try:
        ids = context.chat.prompt_ids([m.as_template_input() for m in body.messages])
    except ChatTemplateError as exc:
        raise ApiError(400, f"messages: {exc}") from None
    max_seq_len = context.engine.model_info.max_seq_len
    max_tokens = body.length_limit() or max(1, max_seq_len - len(ids))
    timer = RequestTimer(context.metrics)
    started = await start(context, body, ids, max_tokens, request, id_prefix="chatcmpl")
    reply = _Reply(started.arrival.request_id, body.model or context.engine.model_info.name)
    source = pieces(context, started, timer)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return PiecesResponse(stream(source, reply, include_usage), source)
    return await collect(source, reply, request, started)


class _Reply:
    """The fields every object of one reply repeats."""

    def __init__(self, request_id: str, model: str) -> None:
        self.request_id, self.model, self.created = request_id, model, int(time.time())

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": kind, "created": self.created,
                "model": self.model}  # fmt: skip

    def chunk(self, delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return self.head("chat.completion.chunk") | {"choices": [choice]}


async def stream(source: Pieces, reply: _Reply, include_usage: bool) -> AsyncIterator[bytes]:
    """Role first, then content deltas, then the finish reason (with usage), ``[DONE]``.
    ``stream_options.include_usage`` adds OpenAI's usage-only chunk before ``[DONE]``."""
    try:
        yield sse(reply.chunk({"role": "assistant", "content": ""})).encode()
        async for piece in source:
            if not isinstance(piece, End):
                yield sse(reply.chunk({"content": piece})).encode()
                continue
            usage = {"usage": piece.usage.as_dict()}
            text = sse(reply.chunk({}, piece.finish_reason) | usage)
            if include_usage:
                text += sse(reply.head("chat.completion.chunk") | {"choices": []} | usage)
            yield (text + "data: [DONE]\n\n").encode()
    except ApiError as exc:
        yield sse({"error": {"message": exc.message, "type": exc.kind}}).encode()


async def collect(source: Pieces, reply: _Reply, request: Request, started: Started) -> Response:
    parts: list[str] = []
    async with aclosing(source):
        async for piece in source:
            if isinstance(piece, End):
                message = {"role": "assistant", "content": "".join(parts)}
                choice = {"index": 0, "message": message, "finish_reason": piece.finish_reason,
                          "logprobs": None}  # fmt: skip
                body = reply.head("chat.completion") | {"choices": [choice]}
                extra = kv_transfer_fields(context_of(request), request, started)
                return JSONResponse(body | {"usage": piece.usage.as_dict()} | extra)
            parts.append(piece)
    raise ApiError(500, "the engine ended the request without finishing it", "engine_error")
