"""Several engine requests as one OpenAI reply (docs/worker.md#http-api): ``n`` choices of
each prompt of a request, started together (all or none), streamed as one interleaved
stream (each chunk names its choice ``index``) or collected whole."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from fastapi import Request

from genpool_worker.api import GenerationRequest
from genpool_worker.events import TokenDelta
from genpool_worker.generation import (
    End,
    Pieces,
    Started,
    accepted,
    check_request,
    pieces,
    start,
    submit,
)
from genpool_worker.http_common import ApiError, ServerContext
from genpool_worker.kv_connector import KVTransfer
from genpool_worker.metrics import RequestTimer
from genpool_worker.sampling_params import TokenLogprobs


def check_model(context: ServerContext, model: str | None) -> None:
    """An unknown ``model`` is OpenAI's 404 (as vLLM answers it)."""
    if model is not None and model not in context.model_names:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")


async def start_choices(
    context: ServerContext,
    body: GenerationRequest,
    prompts: Sequence[list[int]],
    max_tokens_of: Callable[[list[int]], int],
    request: Request,
    *,
    id_prefix: str,
) -> Choices:
    """Choice ``p * n + j`` is prompt ``p``'s ``j``-th; one refused aborts the others.
    All are submitted at once, before any acceptance is awaited, so one pass admits them
    together and a prompt's choices share its prefill. The KV edge plans each prompt's
    KV once: choice 0 carries it (a load, or an export: then it runs alone, once), the
    others compute theirs here (docs/pd.md#n-choices-and-prompt-lists)."""
    received_at = time.time()
    for ids in prompts:
        check_request(context, body, ids, max_tokens_of(ids))
    transfers = await context.kv_edge.plan(body, prompts, request)
    num_choices = 1 if transfers and transfers[0].holds_kv_at_finish else body.n
    started: list[Started] = []
    try:
        for ids, kv in zip(prompts, transfers, strict=True):
            for j in range(num_choices):
                started.append(start(context, body, ids, max_tokens_of(ids), request,
                                     id_prefix=id_prefix, kv=kv if j == 0 else KVTransfer(),
                                     received_at=received_at, choice=j))  # fmt: skip
        submit(context, started)
        for queued in started:
            await accepted(context, queued)
    except ApiError:
        context.kv_edge.release(transfers)  # what was loaded for requests that will not run
        for done in started:
            context.engine.abort(done.arrival.request_id)
        raise
    sources = [pieces(context, s, RequestTimer(context.metrics)) for s in started]
    return Choices(started, sources)


@dataclass
class Collected:
    """One choice, whole: its text, its tokens' logprobs and its end."""

    text: str = ""
    logprobs: list[tuple[int, TokenLogprobs | None]] = field(default_factory=list)
    end: End | None = None


class Choices:
    def __init__(self, started: list[Started], sources: list[Pieces]) -> None:
        self.started, self._sources = started, sources

    @property
    def request_id(self) -> str:
        return self.started[0].arrival.request_id

    async def stream(self) -> AsyncIterator[tuple[int, TokenDelta | End]]:
        """Every choice's pieces as they come, tagged with the choice's index."""
        if len(self._sources) == 1:
            async for piece in self._sources[0]:
                yield 0, piece
            return
        queue: asyncio.Queue[tuple[int, TokenDelta | End | BaseException | None]] = asyncio.Queue()

        async def pump(index: int, source: Pieces) -> None:
            try:
                async for piece in source:
                    await queue.put((index, piece))
            except BaseException as exc:  # the consumer re-raises it
                await queue.put((index, exc))
            finally:
                await queue.put((index, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self._sources)]
        try:
            remaining = len(tasks)
            while remaining:
                index, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()

    async def collect(self) -> list[Collected]:
        """Every choice whole (the engine ended each with an ``End``, or this raises)."""
        results = [Collected() for _ in self._sources]
        try:
            async for index, piece in self.stream():
                if isinstance(piece, End):
                    results[index].end = piece
                else:
                    results[index].text += piece.text
                    results[index].logprobs.extend(piece.logprobs)
        finally:
            await self.aclose()
        if any(r.end is None for r in results):
            raise ApiError(500, "the engine ended a request without finishing it", "engine_error")
        return results

    async def aclose(self) -> None:
        for source in self._sources:
            await source.aclose()


def running_usage(choices: Choices, index: int, delta: TokenDelta) -> dict[str, int]:
    """vLLM's ``continuous_usage_stats``: a choice's usage up to this chunk."""
    prompt = len(choices.started[index].arrival.prompt_ids)
    output = delta.num_output_tokens
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}
