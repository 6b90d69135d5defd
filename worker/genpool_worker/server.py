"""The worker's HTTP API (docs/design.md#worker-http-api): routes validate and serialize,
the engine does the work. Admin endpoints need ``Authorization: Bearer $GENPOOL_ADMIN_TOKEN``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from genpool_worker import admin_routes, completions_route, status_routes
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Tokenizer
from genpool_worker.http_common import ApiError, ServerContext, context_of, error_response
from genpool_worker.metrics import WorkerMetrics

INVALID_STATUSES = (400, 413, 422)  # counted as ``genpool_requests_total{outcome="invalid"}``


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    if exc.status in INVALID_STATUSES:
        context_of(request).metrics.count_request("invalid")
    return error_response(exc.status, exc.message, exc.kind)


def create_app(
    engine: GenEngine,
    tokenizer: Tokenizer,
    metrics: WorkerMetrics,
    *,
    admin_token: str | None = None,
    stamp_arrival: bool = False,
) -> FastAPI:
    app = FastAPI(title="GenPool GEN worker", docs_url=None, redoc_url=None)
    app.state.context = ServerContext(engine, tokenizer, metrics, admin_token, stamp_arrival)
    metrics.engine = engine
    app.add_exception_handler(ApiError, _api_error)
    for module in (completions_route, status_routes, admin_routes):
        app.include_router(module.router)
    return app
