"""A real worker (engine thread + uvicorn on loopback) around the synthetic model."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from genpool_worker.engine import GenEngine
from genpool_worker.engine_io import EngineObserver
from genpool_worker.kv_events import KVEventPublisher, start_kv_events
from genpool_worker.metrics import WorkerMetrics
from genpool_worker.pd.setup import PDSettings, build_pd
from genpool_worker.server import create_app
from genpool_worker.worker_cli import WorkerConfig, build_runner, build_scheduler
from tests.polling import wait_for


@dataclass
class RunningWorker:
    url: str
    engine: GenEngine
    kv_events: KVEventPublisher | None = None  # --kv-events-config's publisher

    def client(self, **kw: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kw)  # type: ignore[arg-type]

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=60.0)


async def complete(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One ``/v1/completions`` that must succeed: its first choice."""
    reply = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens})
    assert reply.status_code == 200, reply.text
    choice: dict[str, Any] = reply.json()["choices"][0]
    return choice


@contextmanager
def run_worker(
    admin_token: str | None = None,
    observer: EngineObserver | None = None,
    wrap_model: Callable[[Any], Any] | None = None,
    kv_secret: str | None = None,
    **overrides: object,
) -> Iterator[RunningWorker]:
    """``observer``: sees every plan in the engine thread (``EngineObserver``).
    ``wrap_model``: the runner's model, wrapped (tests that make the model fail).
    ``kv_secret``: the pool's KV secret (the CLI reads it from --kv-secret-file)."""
    config = WorkerConfig.model_validate(
        {"model": "synthetic:test", "synthetic_time_scale": 0.2, **overrides}
    )
    pool_size = build_scheduler(config).slots.pool_size
    runner, tokenizer, scheduler = build_runner(config, pool_size)
    if wrap_model is not None:
        runner.model = wrap_model(runner.model)
    metrics = WorkerMetrics(runner.info.name, runner.info.is_synthetic)
    kv_transfer = build_pd(runner, runner.info, metrics, PDSettings.from_config(config, kv_secret))
    engine = GenEngine(runner, tokenizer, scheduler, on_step=metrics.observe_step,
                       observer=observer, kv_connector=kv_transfer.connector)  # fmt: skip
    # As the CLI wires it (worker_cli._serve): a binding "*" is the server's 127.0.0.1.
    kv_events = start_kv_events(config.kv_events(), runner.info.kv_block_size, "127.0.0.1")
    engine.kv_events = metrics.kv_events = kv_events
    app = create_app(engine, tokenizer, metrics, admin_token=admin_token,
                     stamp_arrival=config.stamp_arrival,
                     max_arrival_age_s=config.max_arrival_age_s,
                     kv_transfer=kv_transfer)  # fmt: skip
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    engine.start()
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the worker's server thread died before it listened"
        return server.started

    wait_for(started, "the worker's HTTP server to start", 15, interval=0.02)
    try:
        yield RunningWorker(f"http://127.0.0.1:{port}", engine, kv_events)
    finally:
        server.should_exit = True
        thread.join(10)
        engine.stop()
        if kv_events is not None:
            kv_events.close()
        sock.close()


@pytest.fixture
def worker_factory() -> Iterator[Callable[..., RunningWorker]]:
    stack: list[object] = []

    def start(**kw: object) -> RunningWorker:
        manager = run_worker(**kw)  # type: ignore[arg-type]
        stack.append(manager)
        return manager.__enter__()

    yield start
    for manager in reversed(stack):
        manager.__exit__(None, None, None)  # type: ignore[attr-defined]
