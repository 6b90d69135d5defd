"""A decode worker's side (docs/pd.md): what a request's ``kv_transfer_params`` (or a
known prefiller) makes of each of its prompts before it queues: a prefill leg to serve,
a handle to pull, or a local prefill (counted when P/D was asked for and could not be
done). Only the pool's prefill workers are ever contacted."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from genpool_worker.api import GenerationRequest
from genpool_worker.http_common import ApiError
from genpool_worker.kv_connector import KVTransfer
from genpool_worker.pd.context import PREFILL_LEG_TIMEOUT_S, PREFILL_RETRIES, PDContext
from genpool_worker.pd.endpoints import PREFILLER_HEADER, header_endpoint
from genpool_worker.pd.handle import (
    FIELD,
    PREFILL_LEG_PARAMS,
    Handle,
    HandleError,
    ParamsKind,
    classify,
    parse_handles,
    prompt_digest,
)
from genpool_worker.pd.import_budget import ImportCapReached
from genpool_worker.pd.request_kv import PulledKV, leg_export, pulled_kv
from genpool_worker.pd.transfer import PullFailed, cancel, pull

RETRIED_STATUSES = (502, 503, 504)
RETRY_BACKOFF_S = 0.1


def release_imports(transfers: Sequence[KVTransfer]) -> None:
    """Free the pulled KV of requests that will not run (refused after the pull)."""
    for transfer in transfers:
        if isinstance(transfer, PulledKV):
            transfer.pulled.release()


async def plan_kv(pd: PDContext, body: GenerationRequest, prompts: Sequence[list[int]],
                  headers: Mapping[str, str], path: str, own: str) -> list[KVTransfer]:  # fmt: skip
    """What P/D makes of each prompt of the request: a prefill leg's export, a pulled
    handle, or a local prefill (``KVTransfer()``); ``own``: this worker's endpoint, which
    it may contact too. Raises ``ApiError`` for a leg or handle this worker must refuse (a
    400 names the field) or a pull past the import caps (503)."""
    params = body.kv_transfer_params
    kind = classify(params)
    plain = [KVTransfer() for _ in prompts]
    if kind is ParamsKind.PREFILL_LEG:
        _check_prefill_leg(pd, body)
        return [leg_export() for _ in prompts]
    if kind is ParamsKind.FOREIGN:
        pd.metrics.fallback("foreign")
        return plain
    if kind is ParamsKind.NONE and FIELD in body.model_fields_set:
        # ``null``: a sidecar sent the prefill leg and got no handle back; prefill here.
        pd.metrics.fallback("prefill_failed")
        return plain
    is_from_own_leg = kind is ParamsKind.NONE
    if is_from_own_leg:
        params = await _own_prefill_leg(pd, body, headers, path)
        if params is None:
            return plain
    assert params is not None
    try:
        handles = parse_handles(params, len(prompts))
    except HandleError as exc:
        raise ApiError(400, str(exc)) from None
    # A handle a client wrote may name any host: only the pool's prefill workers (or the
    # one this worker's own leg reached) are ever contacted (docs/operations.md).
    trusted = [is_from_own_leg or h.endpoint == own or pd.prefillers.is_known(h.endpoint)
               for h in handles]  # fmt: skip
    if not pd.role.imports or pd.layout is None:
        pd.metrics.fallback("role" if not pd.role.imports else "ranks")
        await _cancel_trusted(pd, handles, trusted)
        return plain
    for handle, ids in zip(handles, prompts, strict=True):
        _check_matches(pd, handle, ids)
    return await _import_all(pd, handles, trusted)


def _check_prefill_leg(pd: PDContext, body: GenerationRequest) -> None:
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


async def _cancel_trusted(pd: PDContext, handles: Sequence[Handle],
                          trusted: Sequence[bool]) -> None:  # fmt: skip
    for handle, is_trusted in zip(handles, trusted, strict=True):
        if is_trusted:
            await cancel(pd, handle)


async def _import_all(pd: PDContext, handles: Sequence[Handle],
                      trusted: Sequence[bool]) -> list[KVTransfer]:  # fmt: skip
    """Pull each prompt's KV from a trusted endpoint (else, or when a pull fails, that
    prompt prefills here, counted); past an import cap nothing is kept and it is a 503."""
    transfers: list[KVTransfer] = []
    for index, (handle, is_trusted) in enumerate(zip(handles, trusted, strict=True)):
        if not is_trusted:
            pd.metrics.fallback("untrusted")
            transfers.append(KVTransfer())
            continue
        try:
            kv_import = await pull(pd, handle)
        except ImportCapReached as exc:
            release_imports(transfers)
            await _cancel_trusted(pd, handles[index:], trusted[index:])
            raise ApiError(503, f"{FIELD}: {exc}", "unavailable") from None
        except PullFailed:
            pd.metrics.fallback("pull_failed")
            await cancel(pd, handle)
            transfers.append(KVTransfer())
            continue
        for part, seconds in (("prefill_queue", handle.queue_s), ("prefill", handle.prefill_s),
                              ("handoff", handle.first_token_age_s)):  # fmt: skip
            pd.metrics.ttft_parts.labels(part).observe(seconds)
        transfers.append(pulled_kv(handle, kv_import))
    return transfers


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
    if pd.vocab_size is not None and handle.first_token >= pd.vocab_size:
        raise ApiError(400, f"{where}.first_token: {handle.first_token} is outside the "
                       f"vocabulary [0, {pd.vocab_size})")  # fmt: skip


async def _own_prefill_leg(pd: PDContext, body: GenerationRequest, headers: Mapping[str, str],
                           path: str) -> dict[str, Any] | None:  # fmt: skip
    """Play llm-d's sidecar: send the prefill leg to the named or a known prefiller and
    return its handles; None (counted) when none answers with them. A header naming an
    endpoint the pool does not know is not followed (unless the router is trusted)."""
    if not pd.role.imports:
        return None
    endpoint = pd.prefillers.next()
    if PREFILLER_HEADER in headers:
        try:
            named = header_endpoint(headers[PREFILLER_HEADER])
        except ValueError as exc:
            raise ApiError(400, f"{PREFILLER_HEADER}: {exc}") from None
        if pd.trusts_prefiller_header or pd.prefillers.is_known(named):
            endpoint = named
        else:
            pd.metrics.fallback("untrusted")
    if endpoint is None:
        return None
    params = await _send_leg(pd, f"http://{endpoint}{path}", prefill_leg_body(body))
    if params is None:
        pd.metrics.fallback("prefill_failed")
    return params


def prefill_leg_body(body: GenerationRequest) -> dict[str, Any]:
    """The client's body as llm-d's sidecar changes it for the prefill leg."""
    leg = body.model_dump(mode="json", exclude_unset=True)
    # One export per prompt, shared by its n choices (a leg runs each prompt once).
    for name in ("stream_options", "min_tokens", "max_completion_tokens", "n", "best_of"):
        leg.pop(name, None)
    if body.min_tokens:  # its first token is drawn as the client's would be: EOS masked
        leg["min_tokens"] = 1
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
