"""A real worker's KV events (docs/worker.md#kv-events) against its prefix cache: a
multi-turn conversation over HTTP publishes each block once, with its tokens and its
parent, the second turn reports the first's blocks as cached, eviction removes what was
stored, the replay socket gives back the live stream, and the render endpoints give the
token ids the completions used."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from genpool_core.block_hash import block_hashes
from genpool_worker.synthetic import SYNTHETIC_KV_BYTES_PER_TOKEN
from tests.worker.conftest import RunningWorker
from tests.worker.kv_events_support import (
    Batch,
    EventStream,
    all_events,
    replay,
    stored_blocks,
)
from tests.worker.pd_support import free_port

BS = 16  # the worker's default KV block size
MODEL = "synthetic:test"
TOPIC = f"kv@127.0.0.1:8000@{MODEL}"
SYSTEM = "system: you answer in riddles about the sea and its many moods.\n"  # 66 tokens


def events_config(port: int, replay_port: int) -> str:
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": f"tcp://*:{port}",
                       "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
                       "topic": TOPIC})  # fmt: skip


class Harness:
    """A worker with KV events on, a live subscriber that has joined, and its client."""

    def __init__(self, start: Callable[..., RunningWorker], **overrides: object) -> None:
        port, replay_port = free_port(), free_port()
        self.worker = start(kv_events_config=events_config(port, replay_port), **overrides)
        self.replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
        self.client = self.worker.client()
        self.stream = EventStream(f"tcp://127.0.0.1:{port}")
        # Each warm-up stores one new block (a 20-token prompt), until the SUB sees one.
        self.stream.join(lambda k: self.complete(f"warm-up {k:03d} of the stream", 1),
                         "the subscriber to join")  # fmt: skip

    def complete(self, prompt: str, max_tokens: int) -> dict[str, object]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
        reply = self.client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        result: dict[str, object] = reply.json()
        return result

    def render(self, prompt: str) -> list[int]:
        reply = self.client.post("/v1/completions/render", json={"model": MODEL,
                                                                 "prompt": prompt})  # fmt: skip
        assert reply.status_code == 200, reply.text
        (one,) = reply.json()
        ids: list[int] = one["token_ids"]
        return ids

    def history(self) -> list[Batch]:
        """Every batch so far, from the replay socket, checked against the live stream."""
        publisher = self.worker.kv_events
        assert publisher is not None
        sent = publisher.counts.sent  # a pass may send more before the replay answers
        self.stream.wait_for_seq(sent - 1)
        replayed = replay(self.replay_endpoint, 0)
        assert len(replayed) >= sent
        assert [b.seq for b in replayed] == list(range(len(replayed)))  # no gap
        live = {b.seq: b.payload for b in self.stream.batches}
        assert all(live[b.seq] == b.payload for b in replayed if b.seq in live)
        assert {b.topic for b in replayed} == {TOPIC.encode()}
        assert {b.rank for b in replayed} == {0}
        return replayed


@pytest.fixture
def harness(worker_factory: Callable[..., RunningWorker]) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**overrides: object) -> Harness:
        made.append(Harness(worker_factory, **overrides))
        return made[-1]

    yield make
    for each in made:
        each.stream.close()
        each.client.close()


def reply_text(result: dict[str, object]) -> str:
    choices = result["choices"]
    assert isinstance(choices, list)
    text: str = choices[0]["text"]
    return text


def check_chain(blocks: dict[int, object], hashes: list[int], tokens: list[int]) -> None:
    """``hashes`` (a sequence's full blocks) were each stored once with their tokens and
    the block before them as parent."""
    for i, block_hash in enumerate(hashes):
        stored = blocks.get(block_hash)
        assert stored is not None, f"block {i} ({block_hash}) was never stored"
        assert stored.parent == (hashes[i - 1] if i else None), f"block {i}'s parent"  # type: ignore[attr-defined]
        assert stored.tokens == tokens[i * BS : (i + 1) * BS], f"block {i}'s tokens"  # type: ignore[attr-defined]
        assert stored.block_size == BS  # type: ignore[attr-defined]


def test_a_conversation_publishes_each_block_once_with_its_tokens_and_parent(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    prompt1 = SYSTEM + "user: what is always coming but never arrives?\nassistant:"
    ids1 = h.render(prompt1)
    assert ids1 == list(prompt1.encode())  # the synthetic tokenizer: bytes
    first = h.complete(prompt1, 20)
    text1 = reply_text(first)
    assert first["usage"]["prompt_tokens"] == len(ids1)  # type: ignore[index]
    full1 = ids1 + list(text1.encode())  # prompt + reply: 20 letters and spaces
    # Turn 2 is turn 1 with its reply and a new message (a chat client's next prompt).
    prompt2 = prompt1 + text1 + "\nuser: and what runs but never walks?\nassistant:"
    ids2 = h.render(prompt2)
    assert ids2[: len(full1)] == full1
    second = h.complete(prompt2, 10)
    full2 = ids2 + list(reply_text(second).encode())
    # Turn 1's prompt and reply blocks are cached: written, whole, before turn 2 came.
    written1 = (len(full1) - 1) // BS  # the last output token's KV is never written
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    assert cached == written1 * BS

    batches = h.history()
    blocks = stored_blocks(batches)
    hashes1 = block_hashes(full1, BS)[:written1]
    hashes2 = block_hashes(full2, BS)[: (len(full2) - 1) // BS]
    assert hashes2[:written1] == hashes1  # one chain: turn 2 continues turn 1's
    check_chain(blocks, hashes2, full2)
    stored = [h for e in all_events(batches, "BlockStored") for h in e[1]]
    assert len(stored) == len(set(stored))  # each block stored once: turn 2 shared turn 1's
    assert all(2**32 <= h < 2**64 for h in stored)
    assert not list(all_events(batches, "BlockRemoved"))  # the cache had room


def test_eviction_removes_blocks_that_were_stored(harness: Callable[..., Harness]) -> None:
    block_bytes = SYNTHETIC_KV_BYTES_PER_TOKEN * BS
    h = harness(max_seq_len=128, kv_cache_memory=13 * block_bytes)  # 12 blocks
    for k in range(8):  # 5 blocks each, 4 of them cached at the end
        h.complete(f"{k} " + SYSTEM, 8)
    batches = h.history()
    stored_so_far: set[int] = set()
    removed: list[int] = []
    for batch in batches:
        for event in batch.events:
            if event[0] == "BlockStored":
                stored_so_far.update(event[1])
            elif event[0] == "BlockRemoved":
                assert set(event[1]) <= stored_so_far, "removed before it was stored"
                stored_so_far.difference_update(event[1])
                removed += event[1]
    assert len(removed) >= 8, removed  # 8 x 4 cached blocks do not fit in 12


def test_render_gives_the_ids_the_chat_completion_used(harness: Callable[..., Harness]) -> None:
    h = harness()
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Which door is never closed?"}]  # fmt: skip
    render = h.client.post("/v1/chat/completions/render",
                           json={"model": MODEL, "messages": messages})  # fmt: skip
    assert render.status_code == 200, render.text
    ids = render.json()["token_ids"]
    before = h.worker.kv_events.counts.sent  # type: ignore[union-attr]
    chat = h.client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 1}
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == len(ids)
    batches = [b for b in h.history() if b.seq >= before]
    check_chain(stored_blocks(batches), block_hashes(ids, BS)[: (len(ids) - 1) // BS], ids)


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/completions/render", {"model": "other", "prompt": "x"}, 404, "does not exist"),
        ("/v1/completions/render", {"prompt": ""}, 422, "prompt must not be empty"),
        ("/v1/completions/render", {"prompt": [1, 999]}, 422, "token ids out of range"),
        ("/v1/chat/completions/render", {"messages": []}, 422, "messages"),
        ("/v1/chat/completions/render",
         {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 422, "type"),
    ],
)  # fmt: skip
def test_render_checks_a_body_as_its_route_does(
    worker_factory: Callable[..., RunningWorker],
    path: str, body: dict[str, object], status: int, message: str,
) -> None:  # fmt: skip
    with worker_factory().client() as client:
        reply = client.post(path, json=body)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"]["message"]


def test_render_takes_every_prompt_form(worker_factory: Callable[..., RunningWorker]) -> None:
    with worker_factory().client() as client:
        for prompt, ids in [
            ("ab", [[97, 98]]),
            ([7, 8, 9], [[7, 8, 9]]),
            (["ab", "c"], [[97, 98], [99]]),
            ([[7], [8, 9]], [[7], [8, 9]]),
        ]:
            # the producer forwards the client's whole body: generation fields too
            body = {"prompt": prompt, "max_tokens": 5, "stream": True, "model": MODEL}
            many = client.post("/v1/completions/render", json=body)
            assert many.status_code == 200, many.text
            assert many.json() == [{"token_ids": one} for one in ids]
        paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/completions/render", "/v1/chat/completions/render"):
        assert "requestBody" in paths[path]["post"]
