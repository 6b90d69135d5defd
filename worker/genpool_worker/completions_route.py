"""``POST /v1/completions``: validate, submit to the engine, serialize its events
(one JSON body, or server-sent events when ``stream`` is set)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from genpool_worker.api import ARRIVAL_SKEW_TOLERANCE_S, CompletionRequest
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.events import Accepted, Failed, Finished, Rejected, TokenDelta
from genpool_worker.http_common import ApiError, ServerContext, context_of, read_json
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


def make_arrival(context: ServerContext, body: CompletionRequest) -> Arrival:
    """The request as the engine sees it; raises ``ApiError`` for what it cannot serve."""
    ids = prompt_ids(context, body)
    max_seq_len = context.engine.model_info.max_seq_len
    if len(ids) + body.max_tokens > max_seq_len:
        raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({body.max_tokens}) "
                       f"exceeds max_seq_len {max_seq_len}")  # fmt: skip
    now = time.time()
    timing = body.genpool
    arrival = timing.arrival_time if timing else None
    if arrival is not None and arrival > now + ARRIVAL_SKEW_TOLERANCE_S:
        raise ApiError(422, f"genpool.arrival_time is {arrival - now:.1f} s in the future")
    if arrival is None and context.stamp_arrival:
        arrival = now
    return Arrival(
        request_id=f"cmpl-{uuid.uuid4().hex[:24]}",
        prompt_ids=ids,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        seed=body.seed,
        arrival_time=arrival,
        first_token_time=timing.first_token_time if timing else None,
    )


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    context = context_of(request)
    body = await read_json(request, CompletionRequest)
    if context.engine.is_draining:
        raise ApiError(503, "worker is draining", "unavailable")
    submitted = EngineRequest(make_arrival(context, body), loop=asyncio.get_running_loop())
    timer = RequestTimer(context.metrics)
    context.engine.submit(submitted)
    first = await submitted.events.get()
    if not isinstance(first, Accepted):
        context.metrics.count_request("rejected")
        status = first.status if isinstance(first, Rejected) else 500
        message = first.message if isinstance(first, (Rejected, Failed)) else repr(first)
        raise ApiError(status, message, "overloaded" if status == 429 else "error")
    context.metrics.count_request("ok")
    name = body.model or context.engine.model_info.name
    if body.stream:
        events = stream_events(context.engine, submitted, name, timer)
        return StreamingResponse(events, media_type="text/event-stream")
    return await collect(submitted, name, timer)


def _chunk(request_id: str, name: str, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def stream_events(
    engine: GenEngine, request: EngineRequest, name: str, timer: RequestTimer
) -> AsyncIterator[bytes]:
    is_closed = False
    try:
        while True:
            event = await request.events.get()
            if isinstance(event, TokenDelta):
                timer.text()
                yield _sse(_chunk(request.request_id, name, event.text, None)).encode()
            elif isinstance(event, Finished):
                is_closed = True
                timer.done(event.usage.completion_tokens)
                chunk = _chunk(request.request_id, name, "", event.reason.value)
                yield (_sse(chunk | {"usage": event.usage.as_dict()}) + "data: [DONE]\n\n").encode()
                return
            elif isinstance(event, Failed):
                is_closed = True
                yield _sse({"error": {"message": event.message}}).encode()
                return
    finally:
        if not is_closed:  # the client went away: free the slot
            engine.abort(request.request_id)


async def collect(request: EngineRequest, name: str, timer: RequestTimer) -> Response:
    parts: list[str] = []
    while True:
        event = await request.events.get()
        if isinstance(event, TokenDelta):
            timer.text()
            parts.append(event.text)
        elif isinstance(event, Finished):
            timer.done(event.usage.completion_tokens)
            body = _chunk(request.request_id, name, "".join(parts), event.reason.value)
            return JSONResponse(body | {"usage": event.usage.as_dict()})
        elif isinstance(event, Failed):
            raise ApiError(500, event.message, "engine_error")
