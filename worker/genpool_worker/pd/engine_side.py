"""The engine loop's P/D side (docs/pd.md): a finished prefill leg's held blocks become an
export (or go back at once when nobody can pull them), and a pulled request whose first
token already ends it is answered without queueing. Runs on the engine thread; no torch."""

from __future__ import annotations

from collections.abc import Callable

from genpool_core.kv_account import KVAccount
from genpool_worker.engine_io import Arrival, EngineRequest, ModelInfo
from genpool_worker.pd.exports import ExportRegistry


class KVHandoff:
    """``release(request_id)`` frees held blocks in the next pass (the engine's inbox).
    ``exports`` is set by the server on a worker that exports KV."""

    def __init__(self, kv: KVAccount, info: ModelInfo, release: Callable[[str], None]) -> None:
        self._kv, self._info, self._release = kv, info, release
        self.exports: ExportRegistry | None = None

    def sweep(self) -> None:
        """Release the exports nobody pulled in time (rank 0, before a pass's inputs)."""
        if self.exports is not None:
            self.exports.sweep()

    def is_done_at_first(self, arrival: Arrival) -> bool:
        """A pulled request with nothing to decode: one token, or an EOS it may stop at."""
        if arrival.kv_import is None:
            return False
        is_eos = arrival.kv_import.first_token in self._info.eos_token_ids
        return arrival.max_tokens <= 1 or (
            is_eos and arrival.min_tokens <= 1 and not arrival.ignore_eos
        )

    def is_stop_at_first(self, request: EngineRequest) -> bool:
        assert request.arrival.kv_import is not None
        is_eos = request.arrival.kv_import.first_token in self._info.eos_token_ids
        return is_eos or request.is_stop_matched

    def on_dropped(self, request: EngineRequest) -> None:
        """The request is gone (finished, refused, failed): its pulled KV, if still in host
        memory, is freed and its bytes leave the import budget."""
        if request.arrival.kv_import is not None:
            request.arrival.kv_import.release()

    def on_finished(self, request: EngineRequest) -> None:
        """A prefill leg ended (not aborted): its held blocks become an export."""
        arrival = request.arrival
        assert arrival.kv_export is not None
        blocks = self._kv.held_blocks(arrival.request_id)
        if self.exports is None or not request.output_ids or not blocks:
            self._release(arrival.request_id)  # nobody can pull it
            return
        num_prompt = len(arrival.prompt_ids)
        prompt_blocks = blocks[: -(-num_prompt // self._info.kv_block_size)]
        self.exports.add(arrival.kv_export, arrival.request_id, prompt_blocks, num_prompt,
                         request.output_ids[0])  # fmt: skip
