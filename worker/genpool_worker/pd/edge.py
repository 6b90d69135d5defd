"""P/D's half at the routes (``kv_edge.KVEdge``; docs/pd.md#the-connector): before a
request queues, what each prompt's KV is (a prefill leg to serve, a handle pulled, or a
local prefill: ``decode_side``); a leg's reply names its exports (``prefill_side``); a
pulled request's time waiting here for its first decoded token is observed when it ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request

from genpool_worker.api import GenerationRequest
from genpool_worker.engine_io import EngineRequest
from genpool_worker.host_port import endpoint_text
from genpool_worker.kv_connector import KVTransfer
from genpool_worker.pd.context import PDContext
from genpool_worker.pd.decode_side import plan_kv, release_imports
from genpool_worker.pd.prefill_side import leg_handles, pull_address
from genpool_worker.pd.request_kv import LegExport


class PDEdge:
    def __init__(self, pd: PDContext) -> None:
        self.pd = pd

    async def plan(
        self, body: GenerationRequest, prompts: Sequence[list[int]], request: Request
    ) -> list[KVTransfer]:
        own = endpoint_text(*pull_address(request))  # this worker may pull from itself
        return await plan_kv(self.pd, body, prompts, request.headers, request.url.path, own)

    def release(self, transfers: Sequence[KVTransfer]) -> None:
        release_imports(transfers)

    def reply_fields(self, request: Request, submitted: Sequence[EngineRequest]) -> dict[str, Any]:
        """A prefill leg's reply carries its handles (top-level, as vLLM's does): one per
        prompt (a leg runs each prompt once); none when any prompt's export is gone."""
        legs = [each for each in submitted if isinstance(each.arrival.kv_transfer, LegExport)]
        if not legs:
            return {}
        params = leg_handles(self.pd, request, legs)
        return {} if params is None else {"kv_transfer_params": params}

    def on_finished(self, submitted: EngineRequest) -> None:
        """A pulled request's GEN wait: from its acceptance here (its KV in) to the first
        token this worker decoded."""
        if submitted.arrival.kv_transfer.is_loaded and submitted.first_token_at is not None:
            gen_wait = max(0.0, submitted.first_token_at - submitted.received_at)
            self.pd.metrics.ttft_parts.labels("gen_wait").observe(gen_wait)
