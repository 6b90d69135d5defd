"""A decode worker's side (docs/pd.md): what a request's ``kv_transfer_params`` (or a
known prefiller) makes of it before it queues: a prefill leg to serve, a handle to pull,
or a local prefill (counted when P/D was asked for and could not be done)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from genpool_worker.api import GenerationRequest
from genpool_worker.engine_io import KVImport
from genpool_worker.http_common import ApiError
from genpool_worker.pd.context import PREFILL_LEG_TIMEOUT_S, PREFILL_RETRIES, PDContext
from genpool_worker.pd.endpoints import PREFILLER_HEADER, header_endpoint
from genpool_worker.pd.handle import (
    FIELD,
    PREFILL_LEG_PARAMS,
    Handle,
    HandleError,
    ParamsKind,
    classify,
    parse_handle,
    prompt_digest,
)
from genpool_worker.pd.transfer import PullFailed, cancel, pull

RETRIED_STATUSES = (502, 503, 504)
RETRY_BACKOFF_S = 0.1


@dataclass(frozen=True, slots=True)
class KVPlan:
    """``kv_export``: serve as a prefill leg under this transfer id. ``kv_import`` (with
    its ``handle``): decode from the pulled KV. Neither: a plain local request."""

    kv_export: str | None = None
    kv_import: KVImport | None = None
    handle: Handle | None = None


async def plan_kv(pd: PDContext, body: GenerationRequest, ids: list[int],
                  headers: Mapping[str, str], path: str) -> KVPlan:  # fmt: skip
    """Raises ``ApiError`` for a leg or handle this worker must refuse (a 400 names the field)."""
    params = body.kv_transfer_params
    kind = classify(params)
    if kind is ParamsKind.PREFILL_LEG:
        return _prefill_leg(pd, body)
    if kind is ParamsKind.FOREIGN:
        pd.metrics.fallback("foreign")
        return KVPlan()
    if kind is ParamsKind.NONE and FIELD in body.model_fields_set:
        # ``null``: a sidecar sent the prefill leg and got no handle back; prefill here.
        pd.metrics.fallback("prefill_failed")
        return KVPlan()
    if kind is ParamsKind.NONE:
        params = await _own_prefill_leg(pd, body, headers, path)
        if params is None:
            return KVPlan()
    assert params is not None
    return await _import(pd, params, ids)


def _prefill_leg(pd: PDContext, body: GenerationRequest) -> KVPlan:
    if not pd.role.exports:
        raise ApiError(
            400, f"{FIELD}.do_remote_decode: this worker (--role decode) serves no prefill legs"
        )
    if pd.layout is None or pd.exports is None:
        raise ApiError(
            400, f"{FIELD}.do_remote_decode: this worker cannot export KV (tensor parallelism)"
        )
    if body.stream:
        raise ApiError(
            400, f"{FIELD}.do_remote_decode: a prefill leg is not streamed (stream: false)"
        )
    return KVPlan(kv_export=uuid.uuid4().hex)


async def _import(pd: PDContext, params: Mapping[str, Any], ids: list[int]) -> KVPlan:
    try:
        handle = parse_handle(params)
    except HandleError as exc:
        raise ApiError(400, str(exc)) from None
    if not pd.role.imports or pd.layout is None:
        pd.metrics.fallback("role" if not pd.role.imports else "ranks")
        await cancel(pd, handle)
        return KVPlan()
    _check_matches(pd, handle, ids)
    try:
        kv_import = await pull(pd, handle)
    except PullFailed:
        pd.metrics.fallback("pull_failed")
        await cancel(pd, handle)
        return KVPlan()
    for part, seconds in (("prefill_queue", handle.queue_s), ("prefill", handle.prefill_s),
                          ("handoff", handle.first_token_age_s)):  # fmt: skip
        pd.metrics.ttft_parts.labels(part).observe(seconds)
    return KVPlan(kv_import=kv_import, handle=handle)


def _check_matches(pd: PDContext, handle: Handle, ids: list[int]) -> None:
    """A handle of another layout or another prompt is refused, never decoded."""
    assert pd.layout is not None
    where = f"{FIELD}.genpool"
    field = pd.layout.mismatch(handle.layout)
    if field is not None:
        raise ApiError(400, f"{where}.layout.{field}: {getattr(handle.layout, field)!r} does not "
                       f"match this worker's {getattr(pd.layout, field)!r}")  # fmt: skip
    if handle.num_prompt_tokens != len(ids):
        raise ApiError(400, f"{where}.num_prompt_tokens: {handle.num_prompt_tokens}, but this "
                       f"request's prompt is {len(ids)} tokens")  # fmt: skip
    if handle.prompt_digest != prompt_digest(ids):
        raise ApiError(400, f"{where}.prompt_digest: the KV is another prompt's")


async def _own_prefill_leg(pd: PDContext, body: GenerationRequest, headers: Mapping[str, str],
                           path: str) -> dict[str, Any] | None:  # fmt: skip
    """Play llm-d's sidecar: send the prefill leg to the named or a known prefiller and
    return its handle; None (counted) when none answers with one."""
    if not pd.role.imports:
        return None
    if PREFILLER_HEADER in headers:
        try:
            endpoint: str | None = header_endpoint(headers[PREFILLER_HEADER])
        except ValueError as exc:
            raise ApiError(400, f"{PREFILLER_HEADER}: {exc}") from None
    else:
        endpoint = pd.prefillers.next()
    if endpoint is None:
        return None
    params = await _send_leg(pd, f"http://{endpoint}{path}", prefill_leg_body(body))
    if params is None:
        pd.metrics.fallback("prefill_failed")
    return params


def prefill_leg_body(body: GenerationRequest) -> dict[str, Any]:
    """The client's body as llm-d's sidecar changes it for the prefill leg."""
    leg = body.model_dump(mode="json", exclude_unset=True)
    for name in ("stream_options", "min_tokens", "max_completion_tokens"):
        leg.pop(name, None)
    return leg | {"kv_transfer_params": dict(PREFILL_LEG_PARAMS), "stream": False, "max_tokens": 1}


async def _send_leg(pd: PDContext, url: str, leg: dict[str, Any]) -> dict[str, Any] | None:
    """POST the leg, retrying 502/503/504; a 4xx the prefiller refused goes to the client."""
    for attempt in range(PREFILL_RETRIES + 1):
        try:
            response = await pd.http.post(url, json=leg, timeout=PREFILL_LEG_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        if response.status_code in RETRIED_STATUSES and attempt < PREFILL_RETRIES:
            await asyncio.sleep(RETRY_BACKOFF_S * 2**attempt)
            continue
        if 400 <= response.status_code < 500 and response.status_code != 429:
            raise ApiError(response.status_code, f"prefill worker {url}: {_error_text(response)}")
        if response.status_code != 200:
            return None
        try:
            params = response.json().get("kv_transfer_params")
        except (ValueError, AttributeError):
            return None
        return (
            params if isinstance(params, dict) and classify(params) is ParamsKind.GENPOOL else None
        )
    return None


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
