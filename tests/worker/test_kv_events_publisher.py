"""The KV event publisher's sockets and thread (worker/genpool_worker/kv_events.py): the
engine's call never waits on the sender (a full queue drops its oldest batch and leaves a
sequence gap), a connecting endpoint reaches a central subscriber, a taken port is a
configuration error naming the flag, closing sends what is queued, a malformed replay
request harms nothing, and the CLI wires it (metrics, SIGTERM)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq

from genpool_core.kv_blocks import BlockRemoved, BlockStored
from genpool_worker.kv_events import KVEventPublisher, KVEventsSocketError
from genpool_worker.kv_events_config import KVEventsConfig
from tests.polling import wait_for
from tests.worker.kv_events_support import EventStream, replay
from tests.worker.pd_support import free_port, worker_process

NO_TOKENS: dict[str, list[int]] = {}


def config(**fields: object) -> KVEventsConfig:
    return KVEventsConfig.model_validate({"enable_kv_cache_events": True, **fields})


def removed(k: int) -> list[BlockRemoved]:
    return [BlockRemoved((2**63 + k,))]


def removed_hash(batch_events: list[list[object]]) -> int:
    (event,) = batch_events
    (block_hash,) = event[1]  # type: ignore[misc]
    return int(block_hash) - 2**63  # type: ignore[call-overload]


@pytest.fixture
def publishers() -> Iterator[list[KVEventPublisher]]:
    made: list[KVEventPublisher] = []
    yield made
    for publisher in made:
        publisher.close()


def test_a_stalled_sender_never_stalls_the_engine_a_full_queue_drops_its_oldest(
    publishers: list[KVEventPublisher],
) -> None:
    replay_port = free_port()
    publisher = KVEventPublisher(config(endpoint=f"tcp://*:{free_port()}", max_queue_size=2,
                                        replay_endpoint=f"tcp://127.0.0.1:{replay_port}"),
                                 16, host="127.0.0.1")  # fmt: skip
    publishers.append(publisher)
    sending, release = threading.Event(), threading.Event()
    real_send = publisher._send

    def stalled_send(batch: object) -> None:  # the socket as slow as it may be
        sending.set()
        release.wait(30)
        real_send(batch)  # type: ignore[arg-type]

    publisher._send = stalled_send  # type: ignore[method-assign]
    publisher.publish(removed(0), NO_TOKENS.__getitem__)
    wait_for(sending.is_set, "the sender to take batch 0", 10, interval=0.01)
    started = time.monotonic()
    for k in (1, 2, 3):  # the queue holds two: batch 1 goes
        publisher.publish(removed(k), NO_TOKENS.__getitem__)
    assert time.monotonic() - started < 0.5  # returned at once, the sender still stuck
    assert publisher.counts.dropped == 1
    release.set()
    wait_for(lambda: publisher.counts.sent == 3, "three batches sent", 10, interval=0.01)
    got = replay(f"tcp://127.0.0.1:{replay_port}", 0)
    assert [b.seq for b in got] == [0, 2, 3]  # the dropped batch is a gap a consumer sees
    assert [removed_hash(b.events) for b in got] == [0, 2, 3]
    assert [b.seq for b in replay(f"tcp://127.0.0.1:{replay_port}", 2)] == [2, 3]


def test_a_malformed_replay_request_harms_nothing(publishers: list[KVEventPublisher]) -> None:
    replay_port = free_port()
    publisher = KVEventPublisher(config(endpoint=f"tcp://*:{free_port()}",
                                        replay_endpoint=f"tcp://127.0.0.1:{replay_port}"),
                                 16, host="127.0.0.1")  # fmt: skip
    publishers.append(publisher)
    context = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", b"short"])  # no 8-byte sequence: ignored
        dealer.send_multipart([b"", b"a", b"b"])  # four frames at the ROUTER: ignored
    finally:
        context.destroy(linger=200)
    publisher.publish(removed(5), NO_TOKENS.__getitem__)
    wait_for(lambda: publisher.counts.sent == 1, "the batch sent", 10, interval=0.01)
    assert [removed_hash(b.events) for b in replay(f"tcp://127.0.0.1:{replay_port}", 0)] == [5]


def test_a_connecting_endpoint_reaches_a_central_subscriber(
    publishers: list[KVEventPublisher],
) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        port = sub.bind_to_random_port("tcp://127.0.0.1")
        topic = "kv@10.0.0.7:8000@m"
        publisher = KVEventPublisher(config(endpoint=f"tcp://127.0.0.1:{port}", topic=topic),
                                     16, host="10.0.0.7")  # fmt: skip
        publishers.append(publisher)
        assert not publisher.is_bound and publisher.endpoint == f"tcp://127.0.0.1:{port}"

        def received() -> list[bytes] | None:  # a SUB misses what came before it joined
            publisher.publish(removed(1), NO_TOKENS.__getitem__)
            return sub.recv_multipart() if sub.poll(300) else None

        frames = wait_for(received, "a batch at the central subscriber", 30, interval=0)
        assert frames[0] == topic.encode() and len(frames) == 3
    finally:
        context.destroy(linger=0)


@pytest.mark.parametrize("field", ["endpoint", "replay_endpoint"])
def test_a_taken_port_is_a_configuration_error_naming_the_flag(
    publishers: list[KVEventPublisher], field: str
) -> None:
    port = free_port()
    publishers.append(KVEventPublisher(config(endpoint=f"tcp://*:{port}"), 16, host="127.0.0.1"))
    fields = {"endpoint": f"tcp://*:{free_port()}", field: f"tcp://*:{port}"}
    with pytest.raises(KVEventsSocketError, match=rf"--kv-events-config: tcp://127.0.0.1:{port}: "):
        KVEventPublisher(config(**fields), 16, host="127.0.0.1")


def test_an_event_that_cannot_be_converted_is_skipped_never_raised(
    publishers: list[KVEventPublisher],
) -> None:
    publisher = KVEventPublisher(config(endpoint=f"tcp://*:{free_port()}"), 16, host="127.0.0.1")
    publishers.append(publisher)

    def broken(request_id: str) -> list[int]:
        raise RuntimeError("a bug in the engine's token lookup")

    stored = BlockStored("r", 0, (2**63 + 1,), None)
    publisher.publish([stored, *removed(1)], broken)  # returns: the engine goes on
    publisher.publish([BlockStored("gone", 0, (2**63 + 2,), None)], NO_TOKENS.__getitem__)
    assert publisher.counts.skipped == 2
    wait_for(lambda: publisher.counts.sent == 1, "the rest of the pass sent", 10, interval=0.01)


def test_closing_sends_what_is_queued() -> None:
    port = free_port()
    publisher = KVEventPublisher(config(endpoint=f"tcp://*:{port}"), 16, host="127.0.0.1")
    stream = EventStream(f"tcp://127.0.0.1:{port}")
    try:
        probes = []  # what the join published: some may still be queued once it returns

        def probe(k: int) -> None:
            probes.append(k)
            publisher.publish(removed(1000 + k), NO_TOKENS.__getitem__)

        stream.join(probe, "the subscriber to join")
        joined = len(probes)
        for k in range(50):
            publisher.publish(removed(k), NO_TOKENS.__getitem__)
        publisher.close()
        assert publisher.counts.sent == joined + 50
        stream.wait_for_seq(joined + 49)
        assert [removed_hash(b.events) for b in stream.batches[-50:]] == list(range(50))
    finally:
        publisher.close()
        stream.close()


def test_the_cli_publishes_counts_and_closes_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    flag = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}",
                       "topic": "kv@127.0.0.1:8000@synthetic:test"})  # fmt: skip
    with worker_process(tmp_path, "--kv-events-config", flag) as (url, process):
        stream = EventStream(f"tcp://127.0.0.1:{port}")

        def complete(k: int) -> httpx.Response:  # two new blocks each
            body = {"prompt": f"a prompt of two blocks, number {k:04d}", "max_tokens": 1}
            return httpx.post(f"{url}/v1/completions", json=body, timeout=30)

        try:
            stream.join(complete, "the subscriber to join")
        finally:
            stream.close()
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        sent = [
            line
            for line in metrics.splitlines()
            if line.startswith("genpool_kv_event_batches_total") and 'outcome="sent"' in line
        ]
        assert sent and float(sent[0].split()[-1]) >= 1, sent
        process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: process.poll() is not None, "the worker to exit", 30)
        assert process.returncode == 0
    with zmq.Context() as context, context.socket(zmq.PUB) as again:
        again.bind(f"tcp://127.0.0.1:{port}")  # the worker let go of its port
