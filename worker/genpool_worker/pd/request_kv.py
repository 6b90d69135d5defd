"""What P/D makes of one prompt's KV, as its request carries it to the engine: the two
P/D kinds of ``kv_connector.KVTransfer``. A GenPool handle's pulled bytes (``PulledKV``:
loaded into the blocks the plan imports them into), or a prefill leg's export
(``LegExport``: its blocks held at finish for a decode worker to pull). No torch."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from genpool_worker.kv_connector import KVTransfer
from genpool_worker.pd.handle import Handle


class KVImport:
    """A prefill tier's KV for a decode-role request (docs/pd.md), pulled into host memory:
    the ``num_blocks`` blocks of its prompt (``KVLayout`` bytes).

    The bytes are held once, until the connector writes them into the request's blocks
    (``take``) or the request goes (``release``); either frees them and calls
    ``on_release`` once (the import budget, ``pd.import_budget``). Thread-safe enough: the
    engine thread takes, and only a request that never reached the engine is released by
    its HTTP handler."""

    def __init__(self, data: bytearray, num_blocks: int,
                 on_release: Callable[[], None] | None = None) -> None:  # fmt: skip
        self._data: bytearray | None = data
        self.num_bytes = len(data)
        self.num_blocks = num_blocks
        self._on_release = on_release

    @property
    def is_held(self) -> bool:
        return self._data is not None

    def take(self) -> bytearray:
        """The bytes, once; the import holds them no longer."""
        data = self._data
        if data is None:
            raise ValueError("the pulled KV was already written or released")
        self.release()
        return data

    def release(self) -> None:
        self._data = None
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release()


@dataclass(frozen=True, kw_only=True)
class PulledKV(KVTransfer):
    """A GenPool handle's KV, pulled: its request decodes from the handle's first token."""

    pulled: KVImport


@dataclass(frozen=True, kw_only=True)
class LegExport(KVTransfer):
    """A prefill leg: when it finishes, its prompt's blocks are exported under
    ``transfer_id`` (the handle its response carries names it)."""

    transfer_id: str


def pulled_kv(handle: Handle, pulled: KVImport) -> PulledKV:
    return PulledKV(first_token=handle.first_token, first_token_age_s=handle.first_token_age_s,
                    pulled=pulled)  # fmt: skip


def leg_export() -> LegExport:
    return LegExport(holds_kv_at_finish=True, transfer_id=uuid.uuid4().hex)
