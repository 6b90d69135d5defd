"""A prefill worker's side of a prefill leg (docs/pd.md#the-prefill-leg): the handle its
response carries once the request finished and its blocks are held. Only durations on
this worker's own clock go into it, so the decode worker's clock need not agree."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fastapi import Request

from genpool_worker.engine_io import EngineRequest
from genpool_worker.pd.context import PDContext
from genpool_worker.pd.handle import Handle, handle_params, prompt_digest
from genpool_worker.pd.request_kv import LegExport


def pull_address(request: Request) -> tuple[str, int]:
    """Where the decode worker pulls from: the local address this connection reached (the
    pod IP in a cluster). Never the ``Host`` header: llm-d's sidecar forwards the prefill
    leg with the client's ``Host``, its own address (docs/llm-d-interop-notes.md)."""
    server = request.scope.get("server")
    if server and server[0] and server[0] not in ("0.0.0.0", "::"):
        return str(server[0]), int(server[1])
    return request.url.hostname or "127.0.0.1", int(request.url.port or 80)


def leg_handles(
    pd: PDContext, request: Request, legs: Sequence[EngineRequest]
) -> dict[str, Any] | None:
    """The response's top-level ``kv_transfer_params``, one handle per prompt; None when
    any prompt holds nothing (aborted, or its export already expired): then the others'
    blocks are freed at once rather than held for a pull that will not come."""
    handles = [_handle(pd, request, leg) for leg in legs]
    present = [h for h in handles if h is not None]
    if len(present) == len(handles):
        return handle_params(present)
    if pd.exports is not None:
        for handle in present:
            pd.exports.cancel(handle.transfer_id)
    return None


def _handle(pd: PDContext, request: Request, submitted: EngineRequest) -> Handle | None:
    arrival = submitted.arrival
    leg = arrival.kv_transfer
    export = (
        None
        if pd.exports is None or not isinstance(leg, LegExport)
        else pd.exports.get(leg.transfer_id)
    )
    if export is None or pd.layout is None or submitted.first_token_at is None:
        return None
    started = submitted.prefill_started_at or submitted.received_at
    now = time.time()
    host, port = pull_address(request)
    return Handle(
        transfer_id=export.transfer_id,
        host=host,
        port=port,
        layout=pd.layout,
        num_prompt_tokens=export.num_prompt_tokens,
        prompt_digest=prompt_digest(arrival.prompt_ids),
        num_blocks=len(export.blocks),
        num_bytes=pd.layout.num_bytes(len(export.blocks)),
        first_token=export.first_token,
        age_s=max(0.0, now - submitted.received_at),
        first_token_age_s=max(0.0, now - submitted.first_token_at),
        queue_s=max(0.0, started - submitted.received_at),
        prefill_s=max(0.0, submitted.first_token_at - started),
        expires_in_s=max(0.0, export.expires_at - time.monotonic()),
    )
