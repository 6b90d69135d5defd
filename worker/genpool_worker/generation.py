"""What both completion endpoints share: an ``Arrival`` from a validated body, the
submit-and-wait-for-admission handshake, and the engine's events as text pieces with
``stop`` strings applied. The routes only format these pieces (text or chat)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from genpool_worker.api import GenerationRequest
from genpool_worker.arrival_key import arrival_key
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.events import (
    Accepted,
    EngineEvent,
    Failed,
    Finished,
    Rejected,
    TokenDelta,
    Usage,
)
from genpool_worker.http_common import ApiError, ServerContext
from genpool_worker.metrics import RequestTimer
from genpool_worker.slo_request import request_slo


@dataclass(frozen=True, slots=True)
class End:
    """The last piece: OpenAI's ``finish_reason`` and the engine's token counts."""

    finish_reason: str
    usage: Usage


def make_arrival(
    context: ServerContext,
    body: GenerationRequest,
    ids: list[int],
    max_tokens: int,
    headers: Mapping[str, str],
    *,
    id_prefix: str,
) -> Arrival:
    """The request as the engine sees it; raises ``ApiError`` for what it cannot serve."""
    max_seq_len = context.engine.model_info.max_seq_len
    if len(ids) + max_tokens > max_seq_len:
        raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) "
                       f"exceeds max_seq_len {max_seq_len}")  # fmt: skip
    slo = request_slo(headers, body.slo)
    timing = body.genpool
    has_own_slo = slo.ttft_s is not None or slo.target_output_tps is not None
    arrival = arrival_key(
        timing,
        headers,
        has_own_slo=has_own_slo,
        stamp_arrival=context.stamp_arrival,
        now=time.time(),
    )
    return Arrival(
        request_id=f"{id_prefix}-{uuid.uuid4().hex[:24]}",
        prompt_ids=ids,
        max_tokens=max_tokens,
        temperature=body.temperature,
        seed=body.seed,
        arrival_time=arrival,
        first_token_time=timing.first_token_time if timing else None,
        slo_ttft_s=slo.ttft_s,
        target_output_tps=slo.target_output_tps,
        stop=body.stop_strings(),
    )


async def submit(context: ServerContext, arrival: Arrival) -> EngineRequest:
    """Queue ``arrival``; returns once the scheduler accepted it, else raises the 4xx/5xx."""
    if context.engine.is_draining:
        raise ApiError(503, "worker is draining", "unavailable")
    submitted = EngineRequest(arrival, loop=asyncio.get_running_loop())
    context.engine.submit(submitted)
    first = await submitted.events.get()
    if not isinstance(first, Accepted):
        context.metrics.count_request("rejected")
        status = first.status if isinstance(first, Rejected) else 500
        message = first.message if isinstance(first, (Rejected, Failed)) else repr(first)
        raise ApiError(status, message, "overloaded" if status == 429 else "error")
    context.metrics.count_request("ok")
    return submitted


class Pieces:
    """A request's output as text pieces, then one ``End`` (stop strings are the engine's:
    its text ends before one and it finishes as a stop). Closed before its ``End`` (the
    client went away, even before the first piece was asked for): the request is
    aborted, freeing its slot."""

    def __init__(self, engine: GenEngine, request: EngineRequest, timer: RequestTimer) -> None:
        self._engine, self._request, self._timer = engine, request, timer
        self._ready: deque[str | End] = deque()
        self._is_done = False

    def __aiter__(self) -> Pieces:
        return self

    async def __anext__(self) -> str | End:
        while not self._ready:
            if self._is_done:
                raise StopAsyncIteration
            self._on_event(await self._request.events.get())
        return self._ready.popleft()

    async def aclose(self) -> None:
        if not self._is_done:
            self._is_done = True
            self._engine.abort(self._request.request_id)

    def _on_event(self, event: EngineEvent) -> None:
        if isinstance(event, TokenDelta):
            self._timer.text()
            self._ready.append(event.text)
        elif isinstance(event, Finished):
            self._is_done = True
            self._timer.done(event.usage.completion_tokens)
            self._ready.append(End(event.reason.value, event.usage))
        elif isinstance(event, Failed):
            self._is_done = True
            raise ApiError(500, event.message, "engine_error")


class PiecesResponse(StreamingResponse):
    """Server-sent events of ``source``; however the response ends (done, client gone,
    even before the first event was produced), ``source`` is closed, so an unfinished
    request is aborted."""

    def __init__(self, events: AsyncIterator[bytes], source: Pieces) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._source.aclose()
