"""The worker's HTTP API (docs/design.md#worker-http-api). Handlers validate and serialize;
the engine does the work. Admin endpoints need ``Authorization: Bearer $GENPOOL_ADMIN_TOKEN``."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from genpool_core.statline import parse_statline
from genpool_worker.api import (
    ARRIVAL_SKEW_TOLERANCE_S,
    MAX_BODY_BYTES,
    CompletionRequest,
    ConfigUpdate,
    DrainRequest,
)
from genpool_worker.engine import EngineRequest, GenEngine, Tokenizer
from genpool_worker.metrics import RequestTimer, WorkerMetrics

RETRY_AFTER_S = "1"


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if status in (429, 503) else None
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, model: type[BaseModel], *, optional: bool = False) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes")
    if optional and not body.strip():
        return model.model_validate({})
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "body is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise ApiError(422, problems) from None


def create_app(
    engine: GenEngine,
    tokenizer: Tokenizer,
    metrics: WorkerMetrics,
    *,
    admin_token: str | None = None,
    stamp_arrival: bool = False,
) -> FastAPI:
    app = FastAPI(title="GenPool GEN worker", docs_url=None, redoc_url=None)
    model = engine.model
    config_lock = asyncio.Lock()
    metrics.engine = engine

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        if exc.status in (400, 413, 422):
            metrics.count_request("invalid")
        return error_response(exc.status, exc.message, exc.kind)

    def require_admin(request: Request) -> None:
        if not admin_token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "admin endpoint: bearer token required", "authentication_error")
        if not hmac.compare_digest(token.encode(), admin_token.encode()):
            raise ApiError(403, "admin endpoint: wrong token", "permission_error")

    def prompt_ids(body: CompletionRequest) -> list[int]:
        if isinstance(body.prompt, str):
            return tokenizer.encode(body.prompt)
        vocab = getattr(model, "vocab_size", None)
        bad = [t for t in body.prompt if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise ApiError(400, f"token ids out of range [0, {vocab}): {bad[:5]}")
        return list(body.prompt)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body: CompletionRequest = await read_json(request, CompletionRequest)
        if engine.is_draining:
            raise ApiError(503, "worker is draining", "unavailable")
        ids = prompt_ids(body)
        if len(ids) + body.max_tokens > model.max_seq_len:
            raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({body.max_tokens}) "
                           f"exceeds max_seq_len {model.max_seq_len}")  # fmt: skip
        now = time.time()
        timing = body.genpool
        arrival = timing.arrival_time if timing else None
        if arrival is not None and arrival > now + ARRIVAL_SKEW_TOLERANCE_S:
            raise ApiError(422, f"genpool.arrival_time is {arrival - now:.1f} s in the future")
        if arrival is None and stamp_arrival:
            arrival = now
        submitted = EngineRequest(
            request_id=f"cmpl-{uuid.uuid4().hex[:24]}",
            prompt_ids=ids,
            max_tokens=body.max_tokens,
            loop=asyncio.get_running_loop(),
            temperature=body.temperature,
            seed=body.seed,
            arrival_time=arrival,
            first_token_time=timing.first_token_time if timing else None,
        )
        timer = RequestTimer(metrics)
        engine.submit(submitted)
        first = await submitted.events.get()
        if first[0] != "accepted":
            metrics.count_request("rejected")
            raise ApiError(first[1], first[2], "overloaded" if first[1] == 429 else "error")
        metrics.count_request("ok")
        name = body.model or model.name
        if body.stream:
            return StreamingResponse(
                stream_events(engine, submitted, name, timer), media_type="text/event-stream"
            )
        return await collect(submitted, name, timer)

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_alive:
            return error_response(500, f"engine stopped: {engine.error}", "engine_error")
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        if not engine.is_alive:
            return error_response(503, "engine stopped", "unavailable")
        if engine.is_draining:
            return error_response(503, "draining", "unavailable")
        return JSONResponse({"status": "ready", "model": model.name})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/statline")
    async def statline() -> Response:
        return PlainTextResponse(engine.snapshot.stat_line + "\n")

    @app.get("/stats")
    async def stats() -> Response:
        snap = engine.snapshot
        line = parse_statline(snap.stat_line)
        body: dict[str, Any] = dataclasses.asdict(line) if line else {}
        body |= {"model": model.name, "synthetic": model.is_synthetic, "inflight": snap.inflight,
                 "tokens_total": snap.tokens_total, "passes": snap.passes,
                 "aborted": snap.stats.aborted}  # fmt: skip
        return JSONResponse(body)

    @app.get("/config")
    async def get_config() -> Response:
        return JSONResponse(engine.snapshot.config)

    @app.put("/config")
    async def put_config(request: Request) -> Response:
        require_admin(request)
        update: ConfigUpdate = await read_json(request, ConfigUpdate)
        async with config_lock:
            if update.generation < engine.generation:
                raise ApiError(409, f"stale generation {update.generation} < {engine.generation}")
            future = engine.reconfigure(update.knobs())
            try:
                config = await asyncio.wrap_future(future)
            except (ValueError, TypeError) as exc:
                raise ApiError(422, str(exc)) from None
            engine.generation = update.generation
            config["generation"] = update.generation
            return JSONResponse(config)

    @app.post("/drain")
    async def drain(request: Request) -> Response:
        require_admin(request)
        body: DrainRequest = await read_json(request, DrainRequest, optional=True)
        engine.is_draining = True
        deadline = time.monotonic() + body.timeout_s
        while engine.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return JSONResponse({"drained": engine.inflight == 0, "inflight": engine.inflight})

    return app


def _chunk(request_id: str, name: str, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }


async def stream_events(
    engine: GenEngine, request: EngineRequest, name: str, timer: RequestTimer
) -> AsyncIterator[bytes]:
    done = False
    try:
        while True:
            event = await request.events.get()
            if event[0] == "token":
                timer.text()
                chunk = _chunk(request.request_id, name, event[1], None)
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            elif event[0] == "done":
                done = True
                timer.done(event[2]["completion_tokens"])
                chunk = _chunk(request.request_id, name, "", event[1]) | {"usage": event[2]}
                yield f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
                return
            elif event[0] == "error":
                done = True
                yield f"data: {json.dumps({'error': {'message': event[2]}})}\n\n".encode()
                return
    finally:
        if not done:  # the client went away: free the slot
            engine.abort(request.request_id)


async def collect(request: EngineRequest, name: str, timer: RequestTimer) -> Response:
    parts: list[str] = []
    while True:
        event = await request.events.get()
        if event[0] == "token":
            timer.text()
            parts.append(event[1])
        elif event[0] == "done":
            timer.done(event[2]["completion_tokens"])
            body = _chunk(request.request_id, name, "".join(parts), event[1])
            return JSONResponse(body | {"usage": event[2]})
        elif event[0] == "error":
            return error_response(500, event[2], "engine_error")
