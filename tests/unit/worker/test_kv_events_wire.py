"""KV events in vLLM's wire format (worker/genpool_worker/kv_events_wire.py), read back
by a decoder written here from the format's description (/tmp/llmd-research/FINDINGS.md,
section 1: vLLM's legacy positional form, which llm-d's router decodes), not from the
encoder: field order, types and integer widths, token ids per block, parent chaining.
Pure: no sockets."""

from __future__ import annotations

import struct
from collections.abc import Callable

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from genpool_core.block_hash import block_hashes, hash_block
from genpool_core.kv_blocks import AllBlocksCleared, BlockPool, BlockRemoved, BlockStored, KVBudget
from genpool_worker.kv_events_wire import (
    WireError,
    message,
    pack_batch,
    replay_end,
    replay_reply,
    to_wire,
)

BS = 4
UINT64, FLOAT64, NIL = 0xCF, 0xCB, 0xC0


class WireInt(int):
    """An integer as it was packed: ``marker`` is its msgpack format byte."""

    marker: int

    def __new__(cls, value: int, marker: int) -> WireInt:
        made = super().__new__(cls, value)
        made.marker = marker
        return made


class WireFloat(float):
    marker: int

    def __new__(cls, value: float, marker: int) -> WireFloat:
        made = super().__new__(cls, value)
        made.marker = marker
        return made


_FIXED = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
          0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}  # fmt: skip


def decode(data: bytes) -> object:
    """msgpack's subset a KV event batch uses (arrays, ints, float64, nil, bools, str),
    each number keeping the format byte it came in."""
    value, end = _read(data, 0)
    assert end == len(data), "trailing bytes after the batch"
    return value


def _read(data: bytes, at: int) -> tuple[object, int]:
    m = data[at]
    at += 1
    if m <= 0x7F or m >= 0xE0:  # positive and negative fixint
        return WireInt(m if m <= 0x7F else m - 0x100, m), at
    if 0x90 <= m <= 0x9F:
        return _array(data, at, m & 0x0F)
    if m in (0xDC, 0xDD):
        size = 2 if m == 0xDC else 4
        return _array(data, at + size, int.from_bytes(data[at : at + size], "big"))
    if 0xA0 <= m <= 0xBF or m in (0xD9, 0xDA, 0xDB):
        size = {0xD9: 1, 0xDA: 2, 0xDB: 4}.get(m, 0)
        n = m & 0x1F if size == 0 else int.from_bytes(data[at : at + size], "big")
        at += size
        return data[at : at + n].decode("utf-8"), at + n
    if m in _FIXED:
        size = struct.calcsize(_FIXED[m])
        return WireInt(struct.unpack(_FIXED[m], data[at : at + size])[0], m), at + size
    if m == FLOAT64:
        return WireFloat(struct.unpack(">d", data[at : at + 8])[0], m), at + 8
    if m in (0xC2, 0xC3):
        return m == 0xC3, at
    if m == NIL:
        return None, at
    raise AssertionError(f"msgpack format 0x{m:02x} is not in a KV event batch")


def _array(data: bytes, at: int, n: int) -> tuple[list[object], int]:
    items = []
    for _ in range(n):
        item, at = _read(data, at)
        items.append(item)
    return items, at


def check_batch(payload: bytes) -> list[list[object]]:
    """The batch's shape as llm-d reads it; its events."""
    batch = decode(payload)
    assert batch == msgpack.unpackb(payload)  # the decoder reads what msgpack reads
    assert isinstance(batch, list) and len(batch) == 3
    ts, events, rank = batch
    assert isinstance(ts, WireFloat) and ts.marker == FLOAT64
    assert isinstance(rank, int) and rank == 0
    assert isinstance(events, list) and events
    for event in events:
        assert isinstance(event, list) and isinstance(event[0], str)
        check_event(event)
    return events


def check_event(event: list[object]) -> None:
    tag = event[0]
    if tag == "AllBlocksCleared":
        assert event == ["AllBlocksCleared"]
        return
    hashes = event[1]
    assert isinstance(hashes, list) and hashes
    for h in hashes:  # llm-d refuses a hash packed shorter than 64 bits (the whole batch)
        assert isinstance(h, WireInt) and h.marker == UINT64 and 2**32 <= h < 2**64
    if tag == "BlockRemoved":
        assert event[2:] == ["GPU"]
        return
    assert tag == "BlockStored" and len(event) == 8
    _, _, parent, tokens, block_size, lora_id, medium, lora_name = event
    assert parent is None or (isinstance(parent, WireInt) and parent.marker == UINT64)
    assert isinstance(tokens, list) and isinstance(block_size, int)
    assert len(tokens) == block_size * len(hashes)  # full blocks only
    assert (lora_id, medium, lora_name) == (None, "GPU", None)


def wire(events: list[object], tokens: dict[str, list[int]]) -> bytes:
    return pack_batch(1_800_000_000.25, [to_wire(e, tokens.__getitem__, BS) for e in events], 0)  # type: ignore[arg-type]


def test_a_conversation_stores_chained_blocks_then_evicts_and_clears() -> None:
    pool = BlockPool(KVBudget(4, BS))
    tokens = {"turn1": list(range(1, 11)), "turn2": [*range(1, 11), 70, 71, 72, 73, 74]}
    first = block_hashes(tokens["turn1"], BS)  # 2 full blocks of 10 tokens
    blocks = pool.allocate(3)
    turn1 = pool.cache("turn1", 0, blocks[:2], first, None)
    pool.release([turn1] if turn1 else [])
    pool.free(blocks[2:])
    second = block_hashes(tokens["turn2"], BS)  # 3 full blocks, the first two turn 1's
    hits = pool.hold(pool.lookup(second))
    turn2 = pool.cache("turn2", 2, pool.allocate(1), second[2:], second[1])
    pool.release([*hits, turn2] if turn2 else hits)
    pool.allocate(4)  # every block: the cached ones are evicted, oldest freed first
    pool.clear_cache()
    events = check_batch(wire(list(pool.take_events()), tokens))

    assert [e[0] for e in events] == ["BlockStored", "BlockStored", "BlockRemoved",
                                      "AllBlocksCleared"]  # fmt: skip
    stored1, stored2, removed, _ = events
    assert stored1[1:5] == [first, None, list(range(1, 9)), BS]
    assert stored2[1:5] == [second[2:], second[1], [*range(9, 11), 70, 71], BS]
    assert sorted(removed[1]) == sorted(second)  # every hash stored is removed


@given(
    prompt=st.lists(st.integers(0, 2**17), min_size=BS, max_size=12 * BS),
    first=st.integers(0, 11),
    count=st.integers(1, 12),
)
def test_stored_tokens_rehash_to_the_events_hashes(prompt: list[int], first: int,
                                                   count: int) -> None:  # fmt: skip
    hashes = block_hashes(prompt, BS)
    first = min(first, len(hashes) - 1)
    count = min(count, len(hashes) - first)
    parent = hashes[first - 1] if first else None
    event = BlockStored("r", first, tuple(hashes[first : first + count]), parent)
    ((_, got_hashes, got_parent, got_tokens, *_),) = check_batch(wire([event], {"r": prompt}))
    link = got_parent
    for i, block_hash in enumerate(got_hashes):  # type: ignore[arg-type]
        link = hash_block(link, got_tokens[i * BS : (i + 1) * BS])  # type: ignore[index]
        assert link == block_hash


def test_the_checker_refuses_a_hash_packed_short() -> None:
    """The pitfall llm-d fails a whole batch on: a small integer packs short."""
    payload = pack_batch(1.0, [["BlockRemoved", [2**32 - 1], "GPU"]], 0)
    with pytest.raises(AssertionError):
        check_batch(payload)


def test_events_whose_tokens_are_gone_are_refused() -> None:
    event = BlockStored("gone", 0, (2**63 + 1,), None)
    with pytest.raises(WireError, match="not resident"):
        to_wire(event, {}.__getitem__, BS)
    short = BlockStored("short", 1, (2**63 + 1, 2**63 + 2), 2**63)
    with pytest.raises(WireError, match="need 12"):
        to_wire(short, {"short": list(range(10))}.__getitem__, BS)


def test_removed_and_cleared_need_no_tokens() -> None:
    fail: Callable[[str], list[int]] = {}.__getitem__
    assert to_wire(BlockRemoved((2**63 + 5,)), fail, BS) == ["BlockRemoved", [2**63 + 5], "GPU"]
    assert to_wire(AllBlocksCleared(), fail, BS) == ["AllBlocksCleared"]


@pytest.mark.parametrize("seq", [0, 1, 255, 2**32 + 7])
def test_frames_carry_the_topic_a_big_endian_sequence_and_the_batch(seq: int) -> None:
    topic, payload = b"kv@10.0.0.7:8000@m", b"\x93"
    frames = message(topic, seq, payload)
    assert len(frames) == 3 and frames[0] == topic and frames[2] == payload
    assert len(frames[1]) == 8 and int.from_bytes(frames[1], "big") == seq
    # replay: a ROUTER reply to ``identity``, then the live frames; the end is sequence -1
    assert replay_reply(b"id", topic, seq, payload) == [b"id", b"", *frames]
    end = replay_end(b"id")
    assert end[:3] == [b"id", b"", b""] and end[4] == b""
    assert int.from_bytes(end[3], "big", signed=True) == -1
