"""The worker's HTTP API (docs/worker.md#http-api): routes validate and serialize, the
engine does the work. Admin endpoints need ``Authorization: Bearer $GENPOOL_ADMIN_TOKEN``.
Every error, the framework's own (404, 405) included, has the JSON shape of
``http_common.error_response``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from genpool_worker import (
    admin_routes,
    chat_route,
    completions_route,
    render_routes,
    status_routes,
)
from genpool_worker.api import DEFAULT_MAX_ARRIVAL_AGE_S
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Tokenizer
from genpool_worker.http_common import ApiError, ServerContext, context_of, error_response
from genpool_worker.kv_edge import KVEdge, KVTransferParts, NoKVEdge
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.openapi import install_openapi

INVALID_STATUSES = (400, 413, 422)  # counted as ``genpool_requests_total{outcome="invalid"}``
ERROR_KINDS = {404: "not_found_error", 405: "invalid_request_error"}


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    if exc.status in INVALID_STATUSES:
        context_of(request).metrics.count_request("invalid")
    return error_response(exc.status, exc.message, exc.kind)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """The router's 404 (no such path) and 405 (path exists, not with this method)."""
    assert isinstance(exc, HTTPException)
    target = f"{request.method} {request.url.path}"
    message = {404: f"no route {target}", 405: f"method not allowed: {target}"}.get(
        exc.status_code, str(exc.detail)
    )
    kind = ERROR_KINDS.get(exc.status_code, "invalid_request_error")
    response = error_response(exc.status_code, message, kind)
    response.headers.update(exc.headers or {})  # 405 carries ``Allow``
    return response


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    context_of(request).metrics.count_request("invalid")
    return error_response(422, str(exc.errors()))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this answer, so the server logs the traceback once.
    return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")


def create_app(
    engine: GenEngine,
    tokenizer: Tokenizer,
    metrics: WorkerMetrics,
    *,
    admin_token: str | None = None,
    stamp_arrival: bool = True,
    max_arrival_age_s: float = DEFAULT_MAX_ARRIVAL_AGE_S,
    kv_transfer: KVTransferParts | None = None,
    aliases: tuple[str, ...] = (),
) -> FastAPI:
    """``kv_transfer``: the parts of a worker whose KV moves in or out (built by the
    wiring, ``worker_cli``), whose connector ``engine`` was built with; None: a colocated
    worker (no KV moves, no routes beyond the worker's own)."""
    app = FastAPI(title="GenPool GEN worker", docs_url=None, redoc_url=None)
    edge: KVEdge = NoKVEdge()
    if kv_transfer is not None:
        assert engine.kv_connector is kv_transfer.connector, "build the engine with its connector"
        edge = kv_transfer.edge
    app.state.context = ServerContext(
        engine, tokenizer, metrics, edge, admin_token=admin_token,
        stamp_arrival=stamp_arrival, max_arrival_age_s=max_arrival_age_s, aliases=aliases,
    )  # fmt: skip
    metrics.attach(engine)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
    for module in (completions_route, chat_route, render_routes, status_routes, admin_routes):
        app.include_router(module.router)
    if kv_transfer is not None:
        app.include_router(kv_transfer.router)
    install_openapi(app, kv_transfer.openapi_bodies if kv_transfer is not None else None)
    return app
