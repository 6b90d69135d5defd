"""The worker process ends when it should (docs/worker.md#engine-loop): a dead engine loop
makes it exit non-zero by itself (the kubelet restarts it), and SIGTERM ends it within the
drain timeout even while a request is still streaming."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx

from tests.polling import wait_for
from tests.worker.pd_support import worker_process

# From the first decode of two rows on, every decode raises (a lost device): the engine
# dies, since no row decodes alone either.
BREAK_THE_ENGINE = """
import genpool_worker.synthetic as synthetic
_decode = synthetic.SyntheticModel.decode
_lost = []
def decode(self, cache, tables, tokens, positions):
    if _lost or len(tables) >= 2:
        _lost.append(True)
        raise RuntimeError("device lost")
    return _decode(self, cache, tables, tokens, positions)
synthetic.SyntheticModel.decode = decode
"""
DRAIN_TIMEOUT_S = 3.0


def test_a_dead_engine_exits_the_process(tmp_path: Path) -> None:
    with worker_process(tmp_path, site_code=BREAK_THE_ENGINE) as (url, process):
        body = {"prompt": "x", "max_tokens": 1000}

        async def two_at_once() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                calls = [client.post("/v1/completions", json=body) for _ in range(2)]
                return await asyncio.gather(*calls)  # two rows decode: the engine dies

        for died in asyncio.run(two_at_once()):
            assert died.status_code == 503, died.text
        code = wait_for(lambda: process.poll(), "the worker to exit by itself", 20)
        assert code == 1


def test_sigterm_ends_the_worker_within_the_drain_timeout(tmp_path: Path) -> None:
    env = {"GENPOOL_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S)}
    with worker_process(tmp_path, env_extra=env) as (url, process):
        body = {"prompt": "x", "max_tokens": 2000, "stream": True}
        with (
            httpx.Client(base_url=url, timeout=30) as client,
            client.stream("POST", "/v1/completions", json=body) as stream,
        ):
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # streaming
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            wait_for(lambda: process.poll() is not None, "the worker to exit", 30)
            took = time.monotonic() - sent
            rest = "\n".join(lines)  # the stream ended at the deadline, with an error event
        assert took < DRAIN_TIMEOUT_S + 5, took
        assert process.returncode == 0, process.returncode
        assert '"error"' in rest and "worker stopped" in rest, rest[-300:]
