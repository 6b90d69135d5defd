"""vLLM's KV event wire format (docs/worker.md#kv-events): the prefix cache's events
(``genpool_core.kv_blocks``) as the msgpack batches vLLM's ZMQ publisher sends, which
llm-d's router indexes. Pure: no sockets, no clock.

A message is three frames: the topic, the batch's sequence number (8 bytes, big-endian,
from 0) and the batch, ``[ts, [event, ...], data_parallel_rank]``. Events take vLLM's
positional ("legacy", ``array_like``) form, which every consumer decodes (llm-d's
kv-cache library up to 0.8 reads nothing else; the tagged-map form came later):

- ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, lora_name]``: ``token_ids`` are exactly the stored blocks' tokens, ``parent``
  the hash of the block before the first (None for a sequence's first block);
- ``["BlockRemoved", block_hashes, medium]``;
- ``["AllBlocksCleared"]``.

The optional trailing fields (``extra_keys``, ``group_idx``, the cache-spec kind) are not
sent: consumers read them only when present, and ``group_idx`` set obliges them to check
the spec kind. Hashes are 64-bit with the top bit set (``genpool_core.block_hash``), so
msgpack always packs them as uint64: llm-d refuses a batch holding a shorter integer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgpack

from genpool_core.kv_blocks import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

MEDIUM_GPU = "GPU"  # vLLM's medium for KV in the engine's own cache (llm-d's "gpu" tier)
# The replay socket's end-of-replay marker: sequence -1 (vLLM's END_SEQ).
END_SEQ = (-1).to_bytes(8, "big", signed=True)
WireEvent = list[object]
TokensOf = Callable[[str], list[int]]


class WireError(ValueError):
    """An event whose tokens cannot be given (its request is gone, or too short)."""


def block_stored(event: BlockStored, tokens: Sequence[int], block_size: int) -> WireEvent:
    """``event`` with the token ids of exactly its blocks (``tokens``: its request's)."""
    start = event.first_block * block_size
    end = start + len(event.hashes) * block_size
    if len(tokens) < end:
        raise WireError(
            f"request {event.request_id} has {len(tokens)} tokens; blocks "
            f"{event.first_block}..{event.first_block + len(event.hashes) - 1} need {end}"
        )
    return ["BlockStored", list(event.hashes), event.parent, list(tokens[start:end]),
            block_size, None, MEDIUM_GPU, None]  # fmt: skip


def to_wire(event: KVEvent, tokens_of: TokensOf, block_size: int) -> WireEvent:
    """One core event in vLLM's positional form; ``WireError`` when its tokens are not
    to be had (``tokens_of`` raises ``KeyError`` for a request no longer resident)."""
    if isinstance(event, BlockStored):
        try:
            tokens = tokens_of(event.request_id)
        except KeyError:
            raise WireError(f"request {event.request_id} is not resident") from None
        return block_stored(event, tokens, block_size)
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.hashes), MEDIUM_GPU]
    assert isinstance(event, AllBlocksCleared)
    return ["AllBlocksCleared"]


def pack_batch(ts: float, events: Sequence[WireEvent], data_parallel_rank: int) -> bytes:
    """The batch's payload frame: ``[ts, events, data_parallel_rank]`` (ts as float64)."""
    packed = msgpack.packb([float(ts), list(events), data_parallel_rank], use_bin_type=True)
    assert isinstance(packed, bytes)
    return packed


def seq_frame(seq: int) -> bytes:
    """A batch's sequence number as its frame: 8 bytes, big-endian, unsigned."""
    return seq.to_bytes(8, "big")


def message(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """The three frames of one published batch."""
    return [topic, seq_frame(seq), payload]


def replay_reply(identity: bytes, topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """One buffered batch to a replay client (a ROUTER reply: identity, empty delimiter,
    then the live message's three frames, as vLLM sends and llm-d reads them)."""
    return [identity, b"", topic, seq_frame(seq), payload]


def replay_end(identity: bytes) -> list[bytes]:
    """The end of a replay: an empty topic, sequence -1, an empty payload."""
    return [identity, b"", b"", END_SEQ, b""]
