"""The worker's OpenAPI document (``GET /openapi.json``) with its request bodies.

The routes read their bodies themselves (``http_common.read_json``: size, UTF-8, JSON
constants, the edge's pydantic check with the model's vocabulary), so FastAPI does not
see them; this adds each body's pydantic schema to the document FastAPI generates, so
that an OpenAPI client or fuzzer (schemathesis: bench/fuzz.py) knows what each endpoint
takes. The pydantic models stay the one definition of every field and bound."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from genpool_core.live import LiveUpdate
from genpool_worker.api import ChatCompletionRequest, CompletionRequest, DrainRequest

REF_TEMPLATE = "#/components/schemas/{model}"
# (path, method) -> (the body's model, is it required)
Bodies = Mapping[tuple[str, str], tuple[type[BaseModel], bool]]
# /drain's body may be empty (every field defaults).
BODIES: Bodies = {
    ("/v1/completions", "post"): (CompletionRequest, True),
    ("/v1/chat/completions", "post"): (ChatCompletionRequest, True),
    ("/v1/completions/render", "post"): (CompletionRequest, True),
    ("/v1/chat/completions/render", "post"): (ChatCompletionRequest, True),
    ("/config", "put"): (LiveUpdate, True),
    ("/drain", "post"): (DrainRequest, False),
}


def install_openapi(app: FastAPI, extra: Bodies | None = None) -> None:
    """Serve the document with the bodies (built once, on first request); ``extra``: the
    bodies of routes installed besides the worker's own (P/D's)."""
    bodies = {**BODIES, **(extra or {})}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_bodies(
                get_openapi(title=app.title, version=app.version, routes=app.routes), bodies
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def with_bodies(document: dict[str, Any], bodies: Bodies = BODIES) -> dict[str, Any]:
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    for (path, method), (model, is_required) in bodies.items():
        schema = model.model_json_schema(ref_template=REF_TEMPLATE)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        operation = document["paths"][path][method]
        operation["requestBody"] = {
            "required": is_required,
            "content": {"application/json": {"schema": {"$ref": REF_TEMPLATE.format(
                model=model.__name__)}}},
        }  # fmt: skip
    return document
