"""What both completion endpoints share: an ``Arrival`` from a validated body, the
submit-and-wait-for-admission handshake, and the engine's events as text pieces (with
their tokens' logprobs) with ``stop`` strings applied. The routes only format these
pieces (text or chat); ``choices`` runs several of them as one reply."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
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
from genpool_worker.kv_connector import KVTransfer
from genpool_worker.metrics import RequestTimer
from genpool_worker.slo_request import request_slo


@dataclass(frozen=True, slots=True)
class End:
    """The last piece: OpenAI's ``finish_reason`` and the engine's token counts."""

    finish_reason: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class Started:
    """A request built for the engine (``submit`` queues it, ``accepted`` waits for the
    scheduler's answer), with what its KV does (``kv``, the KV edge's plan)."""

    arrival: Arrival
    request: EngineRequest
    kv: KVTransfer


def check_request(context: ServerContext, body: GenerationRequest, ids: list[int],
                  max_tokens: int) -> None:  # fmt: skip
    """What the engine could not serve, refused before anything is pulled or queued."""
    if body.min_tokens > max_tokens:
        raise ApiError(
            400, f"min_tokens ({body.min_tokens}) exceeds the length limit ({max_tokens})"
        )
    max_seq_len = context.engine.model_info.max_seq_len
    if len(ids) + max_tokens > max_seq_len:
        raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) "
                       f"exceeds max_seq_len {max_seq_len}")  # fmt: skip


def start(context: ServerContext, body: GenerationRequest, ids: list[int], max_tokens: int,
          request: Request, *, id_prefix: str, kv: KVTransfer, received_at: float,
          choice: int = 0) -> Started:  # fmt: skip
    """Build choice ``choice`` of ``body.n`` with what its prompt's KV does (``kv``);
    raises ``ApiError`` for what it cannot serve. Not yet submitted: ``submit`` hands a
    reply's choices to the engine at once, so one pass admits them together (they share
    a prefill, or the KV one of them loaded). A request that computes its KV for someone
    else (held at finish) runs to its first token only."""
    arrival = make_arrival(context, body, ids, 1 if kv.holds_kv_at_finish else max_tokens,
                           request.headers, id_prefix=id_prefix, kv=kv,
                           received_at=received_at, choice=choice)  # fmt: skip
    # A loaded request's clock here starts once its KV is in (the GEN wait).
    accepted_from = time.time() if kv.is_loaded else received_at
    loop = asyncio.get_running_loop()
    return Started(arrival, EngineRequest(arrival, loop=loop, received_at=accepted_from), kv)


def make_arrival(
    context: ServerContext,
    body: GenerationRequest,
    ids: list[int],
    max_tokens: int,
    headers: Mapping[str, str],
    *,
    id_prefix: str,
    kv: KVTransfer = KVTransfer(),  # noqa: B008 (frozen: one shared empty transfer is safe)
    received_at: float | None = None,
    choice: int = 0,
) -> Arrival:
    """The request as the engine sees it. A loaded request is the specification's GEN
    waiter: keyed at its receipt here (its load counts in its wait), its first token as
    old as the transfer says at that receipt."""
    now = time.time()
    slo = request_slo(headers, body.slo)
    timing = body.genpool
    has_own_slo = slo.ttft_s is not None or slo.target_output_tps is not None
    key = arrival_key(timing, headers, has_own_slo=has_own_slo,
                      stamp_arrival=context.stamp_arrival, now=now,
                      max_age_s=context.max_arrival_age_s)  # fmt: skip
    if choice == 0:  # one request, counted once whatever its n choices
        context.metrics.arrival_keys.labels(key.source, str(key.is_clamped).lower()).inc()
    arrival = key.time
    first_token_time = timing.first_token_time if timing else None
    if kv.is_loaded:
        arrival = now if received_at is None else min(received_at, now)
        first_token_time = max(0.0, arrival - kv.first_token_age_s)
    return Arrival(
        request_id=f"{id_prefix}-{uuid.uuid4().hex[:24]}",
        prompt_ids=ids,
        max_tokens=max_tokens,
        sampling=body.sampling_params(choice),
        arrival_time=arrival,
        first_token_time=first_token_time,
        slo_ttft_s=slo.ttft_s,
        target_output_tps=slo.target_output_tps,
        stop=body.stop_strings(),
        min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        kv_transfer=kv,
    )


def submit(context: ServerContext, started: Sequence[Started]) -> None:
    """Hand every one of ``started`` to the engine in one inbox write (``accepted`` then
    waits for each); refused while draining."""
    if context.engine.is_draining:
        raise ApiError(503, "worker is draining", "unavailable")
    context.engine.submit(*(each.request for each in started))


async def accepted(context: ServerContext, started: Started) -> None:
    """Returns once the scheduler accepted ``started``, else raises the 4xx/5xx."""
    first = await started.request.events.get()
    if isinstance(first, Failed):
        raise failed_error(first)
    if not isinstance(first, Accepted):
        context.metrics.count_request("rejected")
        status = first.status if isinstance(first, Rejected) else 500
        message = first.message if isinstance(first, Rejected) else repr(first)
        raise ApiError(status, message, "overloaded" if status == 429 else "error")
    context.metrics.count_request("ok")


def failed_error(event: Failed) -> ApiError:
    """A 503 (``unavailable``: the engine stopped, retry elsewhere) or this request's 500."""
    return ApiError(event.status, event.message,
                    "unavailable" if event.status == 503 else "engine_error")  # fmt: skip


def reply_fields(
    context: ServerContext, request: Request, started: Sequence[Started]
) -> dict[str, Any]:
    """What the KV edge adds to a whole reply (e.g. the handles of a prefill leg's
    exports: docs/pd.md), from its finished requests."""
    return context.kv_edge.reply_fields(request, [each.request for each in started])


def pieces(context: ServerContext, started: Started, timer: RequestTimer) -> Pieces:
    """The request's pieces; the KV edge sees it finish (a loaded one's GEN wait)."""
    return Pieces(context.engine, started.request, timer, context.kv_edge.on_finished)


class Pieces:
    """A request's output as text pieces, then one ``End`` (stop strings are the engine's:
    its text ends before one and it finishes as a stop). Closed before its ``End`` (the
    client went away, even before the first piece was asked for): the request is
    aborted, freeing its slot."""

    def __init__(
        self,
        engine: GenEngine,
        request: EngineRequest,
        timer: RequestTimer,
        on_finished: Callable[[EngineRequest], None] | None = None,
    ) -> None:
        self._engine, self._request, self._timer = engine, request, timer
        self._on_finished = on_finished
        self._ready: deque[TokenDelta | End] = deque()
        self._is_done = False

    def __aiter__(self) -> Pieces:
        return self

    async def __anext__(self) -> TokenDelta | End:
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
            self._ready.append(event)
        elif isinstance(event, Finished):
            self._is_done = True
            self._timer.done(event.usage.completion_tokens)
            if self._on_finished is not None:
                self._on_finished(self._request)
            self._ready.append(End(event.reason.value, event.usage))
        elif isinstance(event, Failed):
            self._is_done = True
            raise failed_error(event)


class Closable(Protocol):
    async def aclose(self) -> None: ...


class PiecesResponse(StreamingResponse):
    """Server-sent events of ``source``; however the response ends (done, client gone,
    even before the first event was produced), ``source`` is closed, so an unfinished
    request is aborted."""

    def __init__(self, events: AsyncIterator[bytes], source: Closable) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._source.aclose()
