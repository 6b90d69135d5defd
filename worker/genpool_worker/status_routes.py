"""Read-only endpoints: probes, Prometheus metrics, the stat line and ``/stats``.
Each serializes the engine's latest snapshot; none reaches into the engine's state."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from genpool_worker.http_common import context_of, error_response

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    engine = context_of(request).engine
    if not engine.is_alive:
        return error_response(500, f"engine stopped: {engine.error}", "engine_error")
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    engine = context_of(request).engine
    if not engine.is_alive:
        return error_response(503, "engine stopped", "unavailable")
    if engine.is_draining:
        return error_response(503, "draining", "unavailable")
    return JSONResponse({"status": "ready", "model": engine.model_info.name})


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    registry = context_of(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/statline")
async def statline(request: Request) -> Response:
    return PlainTextResponse(context_of(request).engine.snapshot.stat_line + "\n")


@router.get("/statlines")
async def statlines(request: Request) -> Response:
    """The recent periodic stat lines, oldest first (empty before the first period): the
    operator counts each window once however its rounds fall (genpool_core.windows)."""
    return PlainTextResponse(context_of(request).engine.snapshot.recent_lines)


@router.get("/stats")
async def stats(request: Request) -> Response:
    """The stat line's fields (the snapshot's ``StatLine``), plus worker counters."""
    engine = context_of(request).engine
    snap = engine.snapshot
    body: dict[str, Any] = dataclasses.asdict(snap.stat)
    body |= {
        "model": engine.model_info.name,
        "synthetic": engine.model_info.is_synthetic,
        "inflight": snap.inflight,
        "tokens_total": snap.tokens_total,
        "passes": snap.passes,
        "aborted": snap.stats.aborted,
    }
    return JSONResponse(body)
