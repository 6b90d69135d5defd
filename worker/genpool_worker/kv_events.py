"""The KV event publisher (docs/worker.md#kv-events): each pass's prefix-cache events,
in vLLM's wire format (``kv_events_wire``), on a ZeroMQ PUB socket, with vLLM's optional
replay socket, so llm-d's router routes a request to the worker holding its prefix.

The engine thread only converts a pass's events (the token ids of a stored block are read
while its request is still resident) and hands the batch to a sender thread through a
bounded queue; it never waits on a socket. A full queue drops its oldest batch (counted),
never the engine's time. The batch's sequence number is taken when it is queued, so a
dropped batch is a gap a consumer with replay detects (llm-d then rebuilds this worker's
entries). The PUB socket drops at its high-water mark as ZeroMQ does. Every socket is
used by the sender thread alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from genpool_core.kv_blocks import KVEvent
from genpool_worker.kv_events_config import FLAG, KVEventsConfig, binds
from genpool_worker.kv_events_wire import (
    TokensOf,
    WireError,
    WireEvent,
    message,
    pack_batch,
    replay_end,
    replay_reply,
    to_wire,
)

log = logging.getLogger("genpool.kv_events")
POLL_S = 0.1  # the sender's longest wait: how late a replay request is answered when idle
CLOSE_TIMEOUT_S = 1.0  # at shutdown, queued batches get this long to go out (vLLM's)
LINGER_MS = 500  # then the sockets this long to flush what ZeroMQ holds
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


class KVEventsSocketError(ValueError):
    """The endpoint cannot be bound or connected (a configuration error: exit 2)."""


@dataclass
class KVEventCounts:
    """Batches sent, dropped (the queue was full: the engine thread counts them) and
    failed (the socket refused them: the sender counts them); events skipped."""

    sent: int = 0
    dropped: int = 0
    failed: int = 0
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class _Batch:
    seq: int
    ts: float
    events: list[WireEvent]


class DropOldestQueue:
    """A bounded FIFO whose ``put`` never waits: a full queue loses its oldest item."""

    def __init__(self, capacity: int) -> None:
        self._items: deque[_Batch] = deque()
        self._capacity = capacity
        self._ready = threading.Condition()

    def put(self, item: _Batch) -> bool:
        """Queue ``item``; True when the oldest item was dropped to make room."""
        with self._ready:
            is_full = len(self._items) >= self._capacity
            if is_full:
                self._items.popleft()
            self._items.append(item)
            self._ready.notify()
        return is_full

    def get(self, timeout: float) -> _Batch | None:
        with self._ready:
            if not self._items:
                self._ready.wait(timeout)
            return self._items.popleft() if self._items else None

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()


def local_endpoint(endpoint: str, host: str) -> str:
    """A binding tcp endpoint's ``*`` is the worker's ``--host`` (its pod IP under the
    operator): the events are reachable where the HTTP API is, and workers sharing a host
    on their own addresses (the devcluster) do not collide. A wildcard host keeps ``*``."""
    if not endpoint.startswith("tcp://*:") or host in WILDCARD_HOSTS:
        return endpoint
    address = f"[{host}]" if ":" in host else host
    return endpoint.replace("*", address, 1)


class KVEventPublisher:
    """``KVEventSink`` for the engine: vLLM's ``ZmqEventPublisher``, never blocking."""

    def __init__(
        self,
        config: KVEventsConfig,
        block_size: int,
        *,
        host: str = "",
        data_parallel_rank: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        import zmq

        self._block_size, self._dp_rank, self._clock = block_size, data_parallel_rank, clock
        self._topic = config.topic.encode()
        self._context = zmq.Context()
        self.is_bound = binds(config.endpoint)  # decided before "*" becomes --host
        self.endpoint = local_endpoint(config.endpoint, host)
        self._pub = self._open(zmq.PUB, self.endpoint, config.hwm, bind=self.is_bound)
        self._replay = None
        if config.replay_endpoint is not None:
            replay = local_endpoint(config.replay_endpoint, host)
            self._replay = self._open(zmq.ROUTER, replay, config.hwm, bind=True)
        self._queue = DropOldestQueue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0  # engine thread
        self.counts = KVEventCounts()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._send_loop, name="genpool-kv-events",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _open(self, kind: int, endpoint: str, hwm: int, *, bind: bool) -> Any:
        import zmq

        sock = self._context.socket(kind)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        if "[" in endpoint or "::" in endpoint:
            sock.setsockopt(zmq.IPV6, 1)
        try:
            if bind:
                sock.bind(endpoint)
            else:
                sock.connect(endpoint)
        except zmq.ZMQError as exc:  # a port taken, an address not this host's
            self._context.destroy(linger=0)
            raise KVEventsSocketError(f"{FLAG}: {endpoint}: {exc}") from None
        return sock

    # -- the engine thread ----------------------------------------------------------

    def publish(self, events: Sequence[KVEvent], tokens_of: TokensOf) -> None:
        """One pass's events as one batch. Never raises into the engine: an event whose
        tokens are gone is skipped (logged, counted), the rest go."""
        wire: list[WireEvent] = []
        for event in events:
            try:
                wire.append(to_wire(event, tokens_of, self._block_size))
            except WireError as exc:
                self.counts.skipped += 1
                log.warning("KV event skipped: %s", exc)
            except Exception:  # a bug here must not end the engine loop
                self.counts.skipped += 1
                log.exception("KV event skipped: %r", event)
        if not wire:
            return
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        if self._queue.put(_Batch(seq, self._clock(), wire)):
            self.counts.dropped += 1

    # -- the sender thread ----------------------------------------------------------

    def _send_loop(self) -> None:
        try:
            while True:
                if self._replay is not None:
                    self._serve_replays()
                batch = self._queue.get(POLL_S)
                if batch is None:
                    if self._closing.is_set():
                        return
                    continue
                try:
                    self._send(batch)
                except Exception:  # the thread goes on: the next batch may go
                    self.counts.failed += 1
                    log.exception("KV event batch %d not sent", batch.seq)
        finally:
            self._context.destroy(linger=LINGER_MS)

    def _send(self, batch: _Batch) -> None:
        import zmq

        payload = pack_batch(batch.ts, batch.events, self._dp_rank)
        try:
            self._pub.send_multipart(message(self._topic, batch.seq, payload), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.counts.failed += 1
            log.warning("KV event batch %d not sent: %s", batch.seq, exc)
            return
        self._buffer.append((batch.seq, payload))
        self.counts.sent += 1

    def _serve_replays(self) -> None:
        """Answer each waiting replay request: the buffered batches from its start."""
        import zmq

        assert self._replay is not None
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("KV event replay: malformed request of %d frames", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            try:
                for seq, payload in self._buffer:
                    if seq >= start:
                        self._replay.send_multipart(
                            replay_reply(identity, self._topic, seq, payload), zmq.NOBLOCK
                        )
                self._replay.send_multipart(replay_end(identity), zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # the client went, or its queue is full
                log.warning("KV event replay from %d cut: %s", start, exc)

    # -- shutdown ---------------------------------------------------------------------

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Send what is queued (up to ``timeout``), then close the sockets."""
        self._closing.set()
        self._queue.wake()
        self._thread.join(timeout + LINGER_MS / 1000)
        if self._thread.is_alive():
            log.warning("KV event publisher still sending after %.1f s", timeout)


def start_kv_events(
    config: KVEventsConfig | None, block_size: int, host: str
) -> KVEventPublisher | None:
    """The publisher ``--kv-events-config`` asks for (rank 0 only), or None."""
    if config is None or not config.is_publishing:
        return None
    publisher = KVEventPublisher(config, block_size, host=host)
    where = "bound to" if publisher.is_bound else "connecting to"
    log.info("KV events: %s %s, topic %r, block size %d", where, publisher.endpoint,
             config.topic, block_size)  # fmt: skip
    if config.topic.count("@") != 2 or not config.topic.startswith("kv@"):
        log.warning("KV events topic %r is not kv@<pod>@<model>: llm-d reads the model "
                    "from its third part", config.topic)  # fmt: skip
    return publisher
