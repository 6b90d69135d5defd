"""The P/D endpoints (docs/pd.md): the KV pull and its cancel, and the admin view and
update of the known prefill endpoints (the operator keeps them current)."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import iterate_in_threadpool

from genpool_worker.host_port import MAX_ENDPOINTS
from genpool_worker.http_common import ApiError, context_of, read_json, require_admin
from genpool_worker.pd.context import PDContext
from genpool_worker.pd.edge import PDEdge
from genpool_worker.pd.handle import TRANSFER_ID
from genpool_worker.pd.transfer import KV_PATH, send_export

router = APIRouter()


class PrefillersBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    endpoints: list[str] = Field(max_length=MAX_ENDPOINTS)


# The bodies of these routes, for /openapi.json (``openapi.install_openapi``).
OPENAPI_BODIES: dict[tuple[str, str], tuple[type[BaseModel], bool]] = {
    ("/prefillers", "put"): (PrefillersBody, True),
}


def _pd(request: Request) -> PDContext:
    edge = context_of(request).kv_edge
    assert isinstance(edge, PDEdge), "the P/D routes are installed with the P/D edge only"
    return edge.pd


def require_kv_secret(request: Request) -> None:
    """A pull or cancel carries the pool's KV secret (``Authorization: Bearer``) when the
    worker has one: without it a client could read another's KV or free it."""
    secret = _pd(request).kv_secret
    if not secret:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "KV transfer: the pool's KV secret is required",
                       "authentication_error")  # fmt: skip
    if not hmac.compare_digest(token.encode(), secret.encode()):
        raise ApiError(403, "KV transfer: wrong KV secret", "permission_error")


def _transfer_id(transfer_id: str) -> str:
    if not TRANSFER_ID.match(transfer_id):
        raise ApiError(400, "transfer_id must be 32 lowercase hex digits")
    return transfer_id


@router.get(KV_PATH)
async def pull_kv(request: Request, transfer_id: str) -> Response:
    """An export's blocks, once: a second pull, an unknown or expired id is a 404."""
    require_kv_secret(request)
    pd = _pd(request)
    registry = pd.exports
    export = None if registry is None else registry.claim(_transfer_id(transfer_id))
    if registry is None or export is None:
        raise ApiError(
            404, f"no KV export {transfer_id} (unknown, expired or pulled)", "not_found_error"
        )
    layout = pd.layout
    assert layout is not None  # a worker without a layout holds no exports
    metrics = pd.metrics

    async def counted(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            metrics.transfer_bytes.labels("export").inc(len(chunk))
            yield chunk

    chunks = iterate_in_threadpool(pd.connector.read_kv(export.blocks))
    body = send_export(registry, export, counted(chunks))
    headers = {"content-length": str(layout.num_bytes(len(export.blocks)))}
    return StreamingResponse(body, media_type="application/octet-stream", headers=headers)


@router.delete(KV_PATH)
async def cancel_kv(request: Request, transfer_id: str) -> Response:
    """The decode worker will not pull: free the blocks now (204), or 404."""
    require_kv_secret(request)
    registry = _pd(request).exports
    if registry is None or not registry.cancel(_transfer_id(transfer_id)):
        raise ApiError(404, f"no KV export {transfer_id} waiting", "not_found_error")
    return Response(status_code=204)


@router.get("/prefillers")
async def get_prefillers(request: Request) -> Response:
    return JSONResponse({"endpoints": list(_pd(request).prefillers.endpoints)})


@router.put("/prefillers")
async def put_prefillers(request: Request) -> Response:
    """Replace the known prefill endpoints (all checked before any applies)."""
    require_admin(request)
    body = await read_json(request, PrefillersBody)
    try:
        endpoints = _pd(request).prefillers.replace(body.endpoints)
    except ValueError as exc:
        raise ApiError(422, f"endpoints: {exc}") from None
    return JSONResponse({"endpoints": list(endpoints)})
