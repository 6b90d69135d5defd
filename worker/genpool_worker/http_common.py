"""What every route shares: the server's context, API errors and JSON body reading."""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from genpool_worker.api import DEFAULT_MAX_ARRIVAL_AGE_S, MAX_BODY_BYTES
from genpool_worker.chat_template import ChatPrompter, chat_prompter
from genpool_worker.edge_limits import EdgeLimits
from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import Tokenizer
from genpool_worker.kv_edge import KVEdge, NoKVEdge
from genpool_worker.metrics import WorkerMetrics

RETRY_AFTER_S = "1"
Body = TypeVar("Body", bound=BaseModel)


@dataclass
class ServerContext:
    """What the routes serve: set once on ``app.state.context`` by ``create_app``.
    ``kv_edge``: the routes' half of the engine's KV connector."""

    engine: GenEngine
    tokenizer: Tokenizer
    metrics: WorkerMetrics
    kv_edge: KVEdge = field(default_factory=NoKVEdge)
    admin_token: str | None = None
    stamp_arrival: bool = True  # docs/design.md#keyed-by-default
    max_arrival_age_s: float = DEFAULT_MAX_ARRIVAL_AGE_S  # older stamps are clamped to it
    aliases: tuple[str, ...] = ()  # names a request's ``model`` may give besides the served one
    config_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    chat: ChatPrompter = field(init=False)  # the model's chat template, compiled once

    def __post_init__(self) -> None:
        self.chat = chat_prompter(self.tokenizer, self.engine.model_info)

    @property
    def edge_limits(self) -> EdgeLimits:
        return EdgeLimits(vocab_size=self.engine.model_info.vocab_size)

    @property
    def model_names(self) -> tuple[str, ...]:
        """What ``model`` may say: the served id (``/v1/models``) or an alias (``--model``)."""
        return (self.engine.model_info.name, *self.aliases)


def context_of(request: Request) -> ServerContext:
    context = request.app.state.context
    assert isinstance(context, ServerContext)
    return context


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if status in (429, 503) else None
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload)}\n\n"


def require_admin(request: Request) -> None:
    """Admin endpoints need ``Authorization: Bearer <token>`` when a token is set."""
    admin_token = context_of(request).admin_token
    if not admin_token:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "admin endpoint: bearer token required", "authentication_error")
    if not hmac.compare_digest(token.encode(), admin_token.encode()):
        raise ApiError(403, "admin endpoint: wrong token", "permission_error")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(
    request: Request, model: type[Body], *, optional: bool = False, limits: object = None
) -> Body:
    """The body as ``model`` (pydantic: the edge's one check), ``limits`` its validation
    context (``api.EdgeLimits``); a 4xx names what is wrong."""
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes")
    if optional and not body.strip():
        return model.model_validate({})
    try:
        data: Any = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "body is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object")
    try:
        return model.model_validate(data, context=limits)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ApiError(422, problems) from None
