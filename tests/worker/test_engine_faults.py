"""A bad request fails alone (docs/worker.md#engine-loop): what one request causes in the
model (its prefill, its row of a batched decode) fails that request with a 500 naming the
cause, while the requests beside it finish as if it had never come. When the engine
itself breaks (every row fails), every waiting, running and new request fails at once
with a 503 (none hangs), readiness goes false and the engine reports its death."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from tests.polling import wait_for
from tests.worker.conftest import RunningWorker
from tests.worker.pd_support import metric

Factory = Callable[..., RunningWorker]
FAILS_IN_PREFILL = 7  # a prompt token the wrapped model refuses to prefill
FAILS_IN_DECODE = 8  # a prompt token whose request's decode rows the model refuses
PLAIN = {"prompt": "a request beside the bad ones", "max_tokens": 12}


class FaultyModel:
    """The synthetic model, refusing what the tests poison (as a real model raises on a
    bad input or a kernel fault); everything else is the model's own."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._poisoned: set[tuple[int, ...]] = set()  # block tables whose decode raises
        self.is_broken = threading.Event()  # every decode raises (a lost device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def prefill_many(self, cache: Any, spans: Sequence[Any]) -> Any:
        if any(FAILS_IN_PREFILL in span.token_ids for span in spans):
            raise ValueError("the model refuses this prompt")
        self._poisoned.update(tuple(s.blocks) for s in spans if FAILS_IN_DECODE in s.token_ids)
        return self._model.prefill_many(cache, spans)

    def decode(self, cache: Any, tables: Sequence[Sequence[int]], token_ids: list[int],
               positions: list[int]) -> Any:  # fmt: skip
        if self.is_broken.is_set():
            raise RuntimeError("device lost")
        if any(tuple(table) in self._poisoned for table in tables):
            raise IndexError("index out of range in self")
        return self._model.decode(cache, tables, token_ids, positions)


def faulty(worker_factory: Factory, **config: object) -> tuple[RunningWorker, FaultyModel]:
    models: list[FaultyModel] = []

    def wrap(model: Any) -> FaultyModel:
        models.append(FaultyModel(model))
        return models[0]

    return worker_factory(wrap_model=wrap, **config), models[0]


async def _post(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/completions", json=body)


def test_a_request_that_breaks_the_model_fails_alone(worker_factory: Factory) -> None:
    worker, _ = faulty(worker_factory)
    with worker.client() as client:
        alone = client.post("/v1/completions", json=PLAIN).json()["choices"][0]["text"]

    async def together() -> list[httpx.Response]:
        async with worker.async_client() as client:
            bodies = [PLAIN, {"prompt": [104, FAILS_IN_PREFILL], "max_tokens": 5}, PLAIN,
                      {"prompt": [104, FAILS_IN_DECODE], "max_tokens": 9},
                      PLAIN | {"stream": True}]  # fmt: skip
            return await asyncio.gather(*(_post(client, body) for body in bodies))

    replies = asyncio.run(together())
    for bad in (replies[1], replies[3]):
        assert bad.status_code == 500, bad.text
        assert "request failed in the engine" in bad.json()["error"]["message"]
    for good in (replies[0], replies[2]):
        assert good.status_code == 200 and good.json()["choices"][0]["text"] == alone
    assert replies[4].status_code == 200 and "[DONE]" in replies[4].text
    wait_for(lambda: worker.engine.inflight == 0, "every request to leave the engine", 20)
    assert metric(worker.url, "genpool_kv_blocks_used") == 0  # the failed ones' blocks too
    with worker.client() as client:
        assert client.get("/health").status_code == 200
        again = client.post("/v1/completions", json=PLAIN)
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == alone


def test_a_broken_engine_fails_every_request_at_once_and_says_so(worker_factory: Factory) -> None:
    worker, model = faulty(worker_factory)
    deaths: list[BaseException] = []
    worker.engine.on_death = deaths.append

    async def running_when_it_breaks() -> list[httpx.Response]:
        async with worker.async_client() as client:
            body = PLAIN | {"max_tokens": 200}
            calls = [asyncio.create_task(_post(client, body)) for _ in range(3)]
            await asyncio.to_thread(wait_for, lambda: worker.engine.snapshot.stats.active >= 2,
                                    "two requests decoding together", 20)  # fmt: skip
            model.is_broken.set()
            return await asyncio.gather(*calls)

    for reply in asyncio.run(running_when_it_breaks()):
        assert reply.status_code == 503, reply.text
        assert "engine" in reply.json()["error"]["message"]
        assert reply.headers["retry-after"]
    assert len(deaths) == 1
    with httpx.Client(base_url=worker.url, timeout=5) as client:  # no hang: refused at once
        late = client.post("/v1/completions", json=PLAIN)
        assert late.status_code == 503 and "engine stopped" in late.json()["error"]["message"]
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 500
