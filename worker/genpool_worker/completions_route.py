"""``POST /v1/completions``: validate, submit to the engine, serialize its text pieces
(one JSON body, or server-sent events when ``stream`` is set)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from genpool_worker.api import CompletionRequest
from genpool_worker.generation import (
    End,
    Pieces,
    PiecesResponse,
    Started,
    kv_transfer_fields,
    pieces,
    start,
)
from genpool_worker.http_common import ApiError, ServerContext, context_of, read_json, sse
from genpool_worker.metrics import RequestTimer

router = APIRouter()


def prompt_ids(context: ServerContext, body: CompletionRequest) -> list[int]:
    if isinstance(body.prompt, str):
        return context.tokenizer.encode(body.prompt)
    vocab = context.engine.model_info.vocab_size
    bad = [t for t in body.prompt if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        raise ApiError(400, f"token ids out of range [0, {vocab}): {bad[:5]}")
    return list(body.prompt)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    context = context_of(request)
    body = await read_json(request, CompletionRequest)
    ids = prompt_ids(context, body)
    timer = RequestTimer(context.metrics)
    started = await start(context, body, ids, body.max_tokens, request, id_prefix="cmpl")
    request_id = started.arrival.request_id
    name = body.model or context.engine.model_info.name
    source = pieces(context, started, timer)
    if body.stream:
        return PiecesResponse(stream(source, request_id, name), source)
    return await collect(source, request_id, name, request, started)


def _chunk(request_id: str, name: str, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }


async def stream(source: Pieces, request_id: str, name: str) -> AsyncIterator[bytes]:
    try:
        async for piece in source:
            if isinstance(piece, End):
                chunk = _chunk(request_id, name, "", piece.finish_reason)
                usage = {"usage": piece.usage.as_dict()}
                yield (sse(chunk | usage) + "data: [DONE]\n\n").encode()
            else:
                yield sse(_chunk(request_id, name, piece, None)).encode()
    except ApiError as exc:
        yield sse({"error": {"message": exc.message, "type": exc.kind}}).encode()


async def collect(
    source: Pieces, request_id: str, name: str, request: Request, started: Started
) -> Response:
    parts: list[str] = []
    async with aclosing(source):
        async for piece in source:
            if isinstance(piece, End):
                body = _chunk(request_id, name, "".join(parts), piece.finish_reason)
                extra = kv_transfer_fields(context_of(request), request, started)
                return JSONResponse(body | {"usage": piece.usage.as_dict()} | extra)
            parts.append(piece)
    raise ApiError(500, "the engine ended the request without finishing it", "engine_error")
