"""The operator's endpoints: read and change the live knobs, drain before exit."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from genpool_core.live import LiveUpdate, StaleGenerationError
from genpool_worker.api import DrainRequest
from genpool_worker.http_common import ApiError, context_of, read_json, require_admin

DRAIN_POLL_S = 0.05
router = APIRouter()


@router.get("/config")
async def get_config(request: Request) -> Response:
    return JSONResponse(context_of(request).engine.snapshot.config)


@router.put("/config")
async def put_config(request: Request) -> Response:
    """Apply knobs tagged with the operator's generation, together, in the engine's loop
    (an older generation is a 409, a value that cannot apply a 422)."""
    require_admin(request)
    context = context_of(request)
    update = await read_json(request, LiveUpdate)
    async with context.config_lock:
        future = context.engine.reconfigure(update)
        try:
            config = await asyncio.wrap_future(future)
        except StaleGenerationError as exc:
            raise ApiError(409, str(exc)) from None
        except (ValueError, TypeError) as exc:
            raise ApiError(422, str(exc)) from None
        return JSONResponse(config)


@router.post("/drain")
async def drain(request: Request) -> Response:
    """Stop admitting, then wait until every accepted request finished or the timeout."""
    require_admin(request)
    engine = context_of(request).engine
    body = await read_json(request, DrainRequest, optional=True)
    engine.is_draining = True
    deadline = time.monotonic() + body.timeout_s
    while engine.inflight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    return JSONResponse({"drained": engine.inflight == 0, "inflight": engine.inflight})
