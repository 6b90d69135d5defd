"""A KV event consumer for tests: a ZeroMQ SUB socket (and a replay client) reading a
worker's events as llm-d's router reads them (/tmp/llmd-research/FINDINGS.md, section 1):
three frames (topic, 8-byte big-endian sequence, msgpack batch), the batch
``[ts, events, data_parallel_rank]``, events in vLLM's positional form. Written from that
description, not from the worker's encoder."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from tests.polling import wait_for

END_SEQ = -1


@dataclass(frozen=True)
class Batch:
    topic: bytes
    seq: int
    ts: float
    events: list[list[Any]]
    rank: int
    payload: bytes


def decode(frames: list[bytes]) -> Batch:
    assert len(frames) == 3, f"a KV event message has 3 frames, not {len(frames)}"
    topic, seq, payload = frames
    assert len(seq) == 8
    batch = msgpack.unpackb(payload)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, rank = batch
    assert isinstance(ts, float) and isinstance(events, list) and isinstance(rank, int)
    return Batch(topic, int.from_bytes(seq, "big"), ts, events, rank, payload)


@dataclass(frozen=True)
class StoredBlock:
    parent: int | None
    tokens: list[int]
    block_size: int


def stored_blocks(batches: list[Batch]) -> dict[int, StoredBlock]:
    """Every stored block by hash: its parent (the block before it) and its tokens."""
    blocks: dict[int, StoredBlock] = {}
    for event in all_events(batches, "BlockStored"):
        _, hashes, parent, tokens, size, *_ = event
        for i, block_hash in enumerate(hashes):
            blocks[block_hash] = StoredBlock(parent, tokens[i * size : (i + 1) * size], size)
            parent = block_hash
    return blocks


def all_events(batches: list[Batch], tag: str) -> Iterator[list[Any]]:
    return (e for b in batches for e in b.events if e[0] == tag)


class EventStream:
    """A SUB socket on ``endpoint``: every batch it received, in order."""

    def __init__(self, endpoint: str) -> None:
        self._context = zmq.Context()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(endpoint)
        self.batches: list[Batch] = []

    def poll(self, timeout_s: float = 0.05) -> list[Batch]:
        """Whatever arrived within ``timeout_s`` (the new batches)."""
        new = []
        while self._sub.poll(int(timeout_s * 1000)):
            new.append(decode(self._sub.recv_multipart()))
            timeout_s = 0
        self.batches += new
        return new

    def join(self, publish_one: Callable[[int], object], what: str) -> None:
        """Poll until the subscription is live (a SUB misses what was sent before it
        joined): ``publish_one(k)`` makes the publisher send something new each time."""
        tries = itertools.count()

        def joined() -> bool:
            publish_one(next(tries))
            return bool(self.poll(0.3))

        wait_for(joined, what, 30, interval=0)

    def wait_for_seq(self, last_seq: int, timeout_s: float = 20) -> None:
        def arrived() -> bool:
            self.poll()
            return bool(self.batches) and self.batches[-1].seq >= last_seq

        wait_for(arrived, f"KV event batch {last_seq}", timeout_s, interval=0)

    def close(self) -> None:
        self._context.destroy(linger=0)


def replay(endpoint: str, start: int, timeout_s: float = 10) -> list[Batch]:
    """Ask a replay socket for every buffered batch from ``start``, as llm-d does: a
    DEALER sends ``["", start]``; each reply is ``["", topic, seq, payload]``, the last
    ``["", "", -1, ""]``."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        batches = []
        deadline = time.monotonic() + timeout_s
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            assert left_ms > 0 and dealer.poll(left_ms), "the replay did not end"
            frames = dealer.recv_multipart()
            assert frames[0] == b"" and len(frames) == 4, frames
            if frames[1] == b"" and frames[3] == b"":
                assert int.from_bytes(frames[2], "big", signed=True) == END_SEQ
                return batches
            batches.append(decode(frames[1:]))
    finally:
        context.destroy(linger=0)
