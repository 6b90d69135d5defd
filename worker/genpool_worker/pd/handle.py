"""The ``kv_transfer_params`` of an OpenAI body (docs/pd.md): which of the four it is (none,
a prefill leg, a GenPool handle, someone else's handle), and the GenPool handle itself,
parsed so that a malformed one is a 400 naming its field. Pure: no HTTP, no clock."""

from __future__ import annotations

import enum
import hashlib
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from genpool_worker.host_port import endpoint_text
from genpool_worker.kv_layout import KVLayout

HANDLE_KEY = "genpool"  # our handle's key inside kv_transfer_params
HANDLE_VERSION = 1
FIELD = "kv_transfer_params"
TRANSFER_ID = re.compile(r"^[0-9a-f]{32}$")
# What llm-d's sidecar sends on the prefill leg (its nixlv2 connector's request).
PREFILL_LEG_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class ParamsKind(enum.Enum):
    NONE = "none"  # a plain request
    PREFILL_LEG = "prefill_leg"  # run the prompt, hold the KV, answer with a handle
    GENPOOL = "genpool"  # pull our handle's KV and decode
    FOREIGN = "foreign"  # another engine's handle (e.g. vLLM NIXL): prefill locally


class HandleError(ValueError):
    """A malformed handle; ``field`` is its dotted path from the body."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def classify(params: Mapping[str, Any] | None) -> ParamsKind:
    if not params:
        return ParamsKind.NONE
    if params.get("do_remote_decode") is True:
        return ParamsKind.PREFILL_LEG
    if HANDLE_KEY in params:
        return ParamsKind.GENPOOL
    return ParamsKind.FOREIGN


def prompt_digest(prompt_ids: Sequence[int]) -> str:
    """sha256 of the prompt's token ids as little-endian uint32s: both legs tokenize the
    same body, so equal digests mean the pulled KV is this prompt's."""
    return hashlib.sha256(struct.pack(f"<{len(prompt_ids)}I", *prompt_ids)).hexdigest()


@dataclass(frozen=True, slots=True)
class Handle:
    """What a prefill worker tells the decode worker (docs/pd.md#the-prefill-leg). Only
    durations cross the wire: the two pods' clocks need not agree."""

    transfer_id: str
    host: str
    port: int
    layout: KVLayout
    num_prompt_tokens: int
    prompt_digest: str
    num_blocks: int
    num_bytes: int
    first_token: int
    age_s: float  # since the prefill tier received the request, at handoff
    first_token_age_s: float  # since its first token, at handoff
    queue_s: float
    prefill_s: float
    expires_in_s: float

    @property
    def endpoint(self) -> str:
        """``host:port`` of the pull, as the known prefill endpoints spell it."""
        return endpoint_text(self.host, self.port)

    def to_json(self) -> dict[str, Any]:
        """The handle as ``kv_transfer_params.genpool`` carries it."""
        handle = {"version": HANDLE_VERSION} | {
            f.name: getattr(self, f.name) for f in fields(self) if f.name != "layout"
        }
        handle["layout"] = self.layout.to_json()
        return handle

    def to_params(self) -> dict[str, Any]:
        """The top-level ``kv_transfer_params`` of a one-prompt prefill leg's response."""
        return handle_params([self])


def handle_params(handles: Sequence[Handle]) -> dict[str, Any]:
    """A prefill leg's top-level ``kv_transfer_params``: one handle per prompt (an object
    for one prompt, as before; a list, in prompt order, for several)."""
    parts = [handle.to_json() for handle in handles]
    return {"do_remote_prefill": True, "do_remote_decode": False,
            HANDLE_KEY: parts[0] if len(parts) == 1 else parts}  # fmt: skip


def parse_handles(params: Mapping[str, Any], num_prompts: int) -> list[Handle]:
    """The GenPool handles of ``params`` (``classify`` said GENPOOL), one per prompt of
    the request; raises ``HandleError`` naming the field."""
    raw = params.get(HANDLE_KEY)
    where = f"{FIELD}.{HANDLE_KEY}"
    if isinstance(raw, Mapping):
        raw = [raw]
        places = [where]
    elif isinstance(raw, list) and raw:
        places = [f"{where}[{i}]" for i in range(len(raw))]
    else:
        raise HandleError(where, "must be an object or a list of them")
    if len(raw) != num_prompts:
        raise HandleError(where, f"{len(raw)} handles for {num_prompts} prompts")
    return [parse_handle(part, place) for part, place in zip(raw, places, strict=True)]


def parse_handle(raw: object, where: str = f"{FIELD}.{HANDLE_KEY}") -> Handle:
    """One GenPool handle (at ``where`` in the body); raises ``HandleError``."""
    if not isinstance(raw, Mapping):
        raise HandleError(where, "must be an object")
    if raw.get("version") != HANDLE_VERSION:
        raise HandleError(
            f"{where}.version", f"must be {HANDLE_VERSION}, got {raw.get('version')!r}"
        )
    get = _Reader(raw, where)
    handle = Handle(
        transfer_id=get.text("transfer_id", TRANSFER_ID),
        host=get.text("host"),
        port=get.integer("port", low=1, high=65535),
        layout=get.layout("layout"),
        num_prompt_tokens=get.integer("num_prompt_tokens", low=1),
        prompt_digest=get.text("prompt_digest", re.compile(r"^[0-9a-f]{64}$")),
        num_blocks=get.integer("num_blocks", low=1),
        num_bytes=get.integer("num_bytes", low=1),
        first_token=get.integer("first_token", low=0),
        age_s=get.duration("age_s"),
        first_token_age_s=get.duration("first_token_age_s"),
        queue_s=get.duration("queue_s"),
        prefill_s=get.duration("prefill_s"),
        expires_in_s=get.duration("expires_in_s"),
    )
    _check_sizes(handle, where)
    return handle


def _check_sizes(handle: Handle, where: str) -> None:
    blocks = -(-handle.num_prompt_tokens // handle.layout.block_size)
    if handle.num_blocks != blocks:
        raise HandleError(f"{where}.num_blocks", f"{handle.num_prompt_tokens} prompt tokens "
                          f"fill {blocks} blocks, not {handle.num_blocks}")  # fmt: skip
    if handle.num_bytes != handle.layout.num_bytes(handle.num_blocks):
        raise HandleError(f"{where}.num_bytes", f"{handle.num_blocks} blocks of this layout are "
                          f"{handle.layout.num_bytes(handle.num_blocks)} bytes")  # fmt: skip
    if handle.first_token_age_s > handle.age_s:
        raise HandleError(f"{where}.first_token_age_s", "is larger than age_s")


class _Reader:
    """Typed reads of a handle's fields, each error naming its path."""

    def __init__(self, raw: Mapping[str, Any], where: str) -> None:
        self._raw, self._where = raw, where

    def _get(self, name: str) -> Any:
        if name not in self._raw:
            raise HandleError(f"{self._where}.{name}", "is missing")
        return self._raw[name]

    def text(self, name: str, pattern: re.Pattern[str] | None = None) -> str:
        value = self._get(name)
        if not isinstance(value, str) or not value or len(value) > 255:
            raise HandleError(f"{self._where}.{name}", "must be a non-empty string")
        if pattern is not None and not pattern.match(value):
            raise HandleError(f"{self._where}.{name}", f"must match {pattern.pattern}")
        return value

    def integer(self, name: str, *, low: int, high: int | None = None) -> int:
        value = self._get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise HandleError(f"{self._where}.{name}", f"must be an integer >= {low}")
        if high is not None and value > high:
            raise HandleError(f"{self._where}.{name}", f"must be at most {high}")
        return value

    def duration(self, name: str) -> float:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HandleError(f"{self._where}.{name}", "must be a number of seconds")
        if not (math.isfinite(value) and value >= 0.0):
            raise HandleError(f"{self._where}.{name}", "must be finite and >= 0")
        return float(value)

    def layout(self, name: str) -> KVLayout:
        value = self._get(name)
        where = f"{self._where}.{name}"
        if not isinstance(value, Mapping):
            raise HandleError(where, "must be an object")
        inner = _Reader(value, where)
        try:
            return KVLayout(
                model=inner.text("model"),
                dtype=inner.text("dtype"),
                block_size=inner.integer("block_size", low=1),
                num_layers=inner.integer("num_layers", low=1),
                num_kv_heads=inner.integer("num_kv_heads", low=1),
                head_dim=inner.integer("head_dim", low=1),
                tensor_parallel_size=inner.integer("tensor_parallel_size", low=1),
            )
        except HandleError:
            raise
        except ValueError as exc:
            raise HandleError(where, str(exc)) from None
