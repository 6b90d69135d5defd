"""The routes' half of the KV connector (docs/pd.md#the-connector): on the HTTP side,
before a request queues, what each of its prompts' KV does (``kv_connector.KVTransfer``),
so that a transfer that takes a while (a pull over the network) never stalls the
engine's pass; what a whole reply adds from its finished requests; what a finished
request reports. ``NoKVEdge`` is a colocated worker's; P/D's is ``pd.edge``.
``KVTransferParts`` is what the wiring hands the app of a worker whose KV moves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import APIRouter, Request

from genpool_worker.api import GenerationRequest
from genpool_worker.engine_io import EngineRequest
from genpool_worker.kv_connector import KVConnector, KVTransfer
from genpool_worker.openapi import Bodies


class KVEdge(Protocol):
    async def plan(
        self, body: GenerationRequest, prompts: Sequence[list[int]], request: Request
    ) -> list[KVTransfer]:
        """One transfer per prompt, in order (``KVTransfer()``: computed here). Raises
        ``http_common.ApiError`` for what this worker must refuse."""
        ...

    def release(self, transfers: Sequence[KVTransfer]) -> None:
        """Their requests will not run (refused after ``plan``): free what it loaded."""
        ...

    def reply_fields(self, request: Request, submitted: Sequence[EngineRequest]) -> dict[str, Any]:
        """Top-level fields of a whole (not streamed) reply, once its requests finished."""
        ...

    def on_finished(self, submitted: EngineRequest) -> None:
        """A request's last event reached its handler (its timings are final)."""
        ...


class NoKVEdge:
    """Every prompt's KV is computed here; ``kv_transfer_params`` are ignored."""

    async def plan(
        self, body: GenerationRequest, prompts: Sequence[list[int]], request: Request
    ) -> list[KVTransfer]:
        return [KVTransfer() for _ in prompts]

    def release(self, transfers: Sequence[KVTransfer]) -> None:
        pass

    def reply_fields(self, request: Request, submitted: Sequence[EngineRequest]) -> dict[str, Any]:
        return {}

    def on_finished(self, submitted: EngineRequest) -> None:
        pass


@dataclass(frozen=True, slots=True)
class KVTransferParts:
    """A worker's KV transfer, built before its engine (P/D's: ``pd.setup.build_pd``):
    ``connector``, the engine's (``GenEngine(kv_connector=...)``); ``edge``, what the
    routes call, over the same connector; ``router`` and ``openapi_bodies``, the routes it
    adds to the worker's app (``server.create_app(kv_transfer=...)``)."""

    connector: KVConnector
    edge: KVEdge
    router: APIRouter
    openapi_bodies: Bodies
