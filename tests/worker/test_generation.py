"""``Pieces``: an engine request's events as text pieces and aborts; the output
processor's stop strings."""

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
from genpool_worker.output_processor import OutputProcessor


class FakeEngine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def pieces_of(events: list[Any]) -> tuple[Pieces, FakeEngine]:
    engine = FakeEngine()
    request = EngineRequest(Arrival("r1", [1], max_tokens=8))
    for event in events:
        request.events.put_nowait(event)
    timer = RequestTimer(WorkerMetrics("m", is_synthetic=True))
    return Pieces(cast(GenEngine, engine), request, timer), engine


class Collected:
    """An ``EngineRequest``'s emitted events, without an event loop."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.request = EngineRequest(Arrival("r1", [1], max_tokens=8, stop=stops))
        self.events: list[Any] = []
        self.request.emit = self.events.append  # type: ignore[method-assign]


class ByteTokenizer:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


async def drain(pieces: Pieces) -> list[str | End]:
    return [piece async for piece in pieces]


def test_the_output_processor_ends_the_text_before_a_stop_string_and_marks_the_match() -> None:
    output = OutputProcessor(ByteTokenizer(), eos_token_ids=(0,))
    collected = Collected(stops=("##",))
    for token in b"abc##de":
        output.on_token(collected.request, token)
        if collected.request.is_stop_matched:
            break  # the engine finishes it as a stop in its next pass
    output.on_finished(collected.request, FinishReason.STOP)
    texts = [e.text for e in collected.events if isinstance(e, TokenDelta)]
    assert texts == ["a", "b", "c"]  # "#" held back until the match settled it
    assert collected.events[-1] == Finished(FinishReason.STOP, Usage(1, 5))


def test_without_a_match_held_back_text_is_flushed_at_the_end() -> None:
    output = OutputProcessor(ByteTokenizer(), eos_token_ids=(0,))
    collected = Collected(stops=("##",))
    for token in b"a#":
        output.on_token(collected.request, token)
    assert not collected.request.is_stop_matched
    output.on_finished(collected.request, FinishReason.LENGTH)
    texts = [e.text for e in collected.events if isinstance(e, TokenDelta)]
    assert texts == ["a", "#"]


def test_pieces_pass_the_text_and_the_engine_reason() -> None:
    usage = Usage(1, 2)
    pieces, engine = pieces_of([TokenDelta("a#"), Finished(FinishReason.STOP, usage)])
    assert asyncio.run(drain(pieces)) == [TokenDelta("a#"), End("stop", usage)]
    assert engine.aborted == []


def test_closing_before_the_end_aborts_even_before_the_first_piece() -> None:
    pieces, engine = pieces_of([])
    asyncio.run(pieces.aclose())
    assert engine.aborted == ["r1"]
    done, engine = pieces_of([Finished(FinishReason.STOP, Usage(1, 1))])
    asyncio.run(drain(done))
    asyncio.run(done.aclose())
    assert engine.aborted == []


@pytest.mark.parametrize(("status", "kind"), [(500, "engine_error"), (503, "unavailable")])
def test_a_failure_in_the_engine_keeps_its_status(status: int, kind: str) -> None:
    # 500: this request alone failed; 503: the engine stopped (every request fails).
    pieces, _ = pieces_of([TokenDelta("a"), Failed("boom", status)])
    with pytest.raises(ApiError) as caught:
        asyncio.run(drain(pieces))
    assert (caught.value.status, caught.value.message, caught.value.kind) == (status, "boom", kind)


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
