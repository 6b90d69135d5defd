"""P/D's KV connector (``kv_connector.KVConnector``; docs/pd.md#the-connector): what the
engine and the runner do with the KV a request carries (``request_kv``).

Request side (engine thread): a pulled request's bytes are kept from its queueing until
the runner loads them or the request goes; a finished prefill leg's held blocks become an
export in the registry, which gives them back (``take_released``) once they were pulled,
cancelled or expired. Execution side (runner): the pulled bytes are written into the
first of the blocks the plan imported them into; an export's blocks are read out for its
pull (HTTP threads) through the same cache port. No torch here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.kv_connector import KVCachePort, NoKVToLoad
from genpool_worker.kv_layout import KVLayout
from genpool_worker.pd.exports import ExportRegistry
from genpool_worker.pd.request_kv import LegExport, PulledKV


class PDConnector:
    """``export_timeout_s`` None: this worker exports nothing (``--role decode``, or a
    cache whose KV cannot move); ``on_export_outcome`` counts how each export ended."""

    def __init__(
        self,
        cache: KVCachePort,
        block_size: int,
        *,
        export_timeout_s: float | None,
        on_export_outcome: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self._cache, self._block_size = cache, block_size
        self._loads: dict[str, PulledKV] = {}  # queued, not yet loaded (engine thread)
        self._lock = threading.Lock()
        self._released: list[str] = []  # the registry's releases, from any thread
        self._wake: Callable[[], None] = lambda: None
        self.exports: ExportRegistry | None = None
        if export_timeout_s is not None:
            self.exports = ExportRegistry(
                self._release, timeout_s=export_timeout_s, on_outcome=on_export_outcome
            )

    # -- request side (engine thread) ---------------------------------------------------

    def on_queued(self, arrival: Arrival) -> None:
        if isinstance(arrival.kv_transfer, PulledKV):
            self._loads[arrival.request_id] = arrival.kv_transfer

    def on_held(self, request: EngineRequest, blocks: tuple[int, ...]) -> bool:
        """A finished prefill leg's prompt blocks become its export (nobody can pull a
        leg without a token or blocks, or on a worker that exports nothing)."""
        arrival = request.arrival
        leg = arrival.kv_transfer
        if self.exports is None or not isinstance(leg, LegExport):
            return False
        if not request.output_ids or not blocks:
            return False
        num_prompt = len(arrival.prompt_ids)
        prompt_blocks = blocks[: -(-num_prompt // self._block_size)]
        self.exports.add(leg.transfer_id, arrival.request_id, prompt_blocks, num_prompt,
                         request.output_ids[0])  # fmt: skip
        return True

    def drop(self, arrival: Arrival) -> None:
        """Its pulled bytes, if still in host memory, are freed and leave the import budget."""
        self._loads.pop(arrival.request_id, None)
        if isinstance(arrival.kv_transfer, PulledKV):
            arrival.kv_transfer.pulled.release()

    def take_released(self) -> list[str]:
        if self.exports is not None:
            self.exports.sweep()  # the expired ones come back through _release
        with self._lock:
            released, self._released = self._released, []
        return released

    def set_wake(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def _release(self, request_id: str) -> None:
        with self._lock:
            self._released.append(request_id)
        self._wake()  # an idle engine takes them now, not at its next idle pass

    # -- execution side (runner; reads on HTTP threads) ------------------------------------

    def load_kv(self, request_id: str, blocks: tuple[int, ...]) -> int:
        load = self._loads.pop(request_id, None)
        if load is None or load.first_token is None:
            raise NoKVToLoad(f"no pulled KV for {request_id}")
        # The pulled bytes leave host memory as they are written (KVImport.take; it
        # raises if its request's handler released them, refused after the pull).
        self._cache.write_kv(blocks[: load.pulled.num_blocks], load.pulled.take())
        return load.first_token

    def kv_layout(self) -> KVLayout | None:
        return self._cache.kv_layout()

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        return self._cache.read_kv(blocks)
