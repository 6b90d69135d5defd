"""``Pieces``: an engine request's events as text pieces, stop strings and aborts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from starlette.requests import ClientDisconnect

from genpool_core.request import FinishReason
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.events import Failed, Finished, TokenDelta, Usage
from genpool_worker.generation import End, Pieces, PiecesResponse
from genpool_worker.http_common import ApiError
from genpool_worker.metrics import RequestTimer, WorkerMetrics


class FakeEngine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def pieces_of(events: list[Any], stops: tuple[str, ...] = ()) -> tuple[Pieces, FakeEngine]:
    engine = FakeEngine()
    request = EngineRequest(Arrival("r1", [1], max_tokens=8))
    for event in events:
        request.events.put_nowait(event)
    timer = RequestTimer(WorkerMetrics("m", is_synthetic=True))
    return Pieces(cast(GenEngine, engine), request, stops, timer), engine


async def drain(pieces: Pieces) -> list[str | End]:
    return [piece async for piece in pieces]


def test_a_stop_string_aborts_once_and_ends_with_stop() -> None:
    usage = Usage(1, 5)
    events = [TokenDelta("ab"), TokenDelta("c#"), TokenDelta("#d"), TokenDelta("e"),
              Finished(FinishReason.ABORT, usage)]  # fmt: skip
    pieces, engine = pieces_of(events, stops=("##",))
    assert asyncio.run(drain(pieces)) == ["ab", "c", End("stop", usage)]
    assert engine.aborted == ["r1"]


def test_without_a_match_the_engine_reason_and_all_text_pass() -> None:
    usage = Usage(1, 2)
    pieces, engine = pieces_of([TokenDelta("a#"), Finished(FinishReason.LENGTH, usage)], ("##",))
    assert asyncio.run(drain(pieces)) == ["a", "#", End("length", usage)]
    assert engine.aborted == []


def test_closing_before_the_end_aborts_even_before_the_first_piece() -> None:
    pieces, engine = pieces_of([])
    asyncio.run(pieces.aclose())
    assert engine.aborted == ["r1"]
    done, engine = pieces_of([Finished(FinishReason.STOP, Usage(1, 1))])
    asyncio.run(drain(done))
    asyncio.run(done.aclose())
    assert engine.aborted == []


def test_an_engine_failure_is_a_500() -> None:
    pieces, _ = pieces_of([TokenDelta("a"), Failed("boom")])
    with pytest.raises(ApiError) as caught:
        asyncio.run(drain(pieces))
    assert caught.value.status == 500 and caught.value.message == "boom"


def test_a_response_that_fails_before_its_first_event_aborts() -> None:
    pieces, engine = pieces_of([])
    started: list[bool] = []

    async def events() -> AsyncIterator[bytes]:
        started.append(True)
        yield b""

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # no disconnect message: the send fails first
        return {}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("client gone")  # the headers cannot be sent

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):  # what Starlette makes of the OSError
        asyncio.run(PiecesResponse(events(), pieces)(scope, receive, send))
    assert started == [] and engine.aborted == ["r1"]
