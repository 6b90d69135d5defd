"""Rank 0's HTTP server for the life of the worker process (docs/worker.md#engine-loop):
SIGTERM stops admission and cuts what is still open at the drain timeout, a dead engine
stops the server (the process then exits 1), and the pool's KV secret is read from its
file. No torch; uvicorn is imported when a server is built."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from genpool_core.names import KV_SECRET_FILE_ENV
from genpool_worker.drain_cli import default_timeout
from genpool_worker.engine import GenEngine
from genpool_worker.worker_config import WorkerConfig

log = logging.getLogger("genpool.worker")
SHUTDOWN_MARGIN_S = 1.0  # past the drain timeout: the engine's last pass and the replies
DRAIN_POLL_S = 0.05
# How long an idle keep-alive connection stays open. It must outlast the idle expiry of
# every pool that reuses connections to the worker (Go's http.Transport in llm-d's sidecar
# and routers: 90 s; httpx: 5 s, uvicorn's own default too): a server that closes first
# races the client's next request on that connection, which then fails with a reset.
KEEP_ALIVE_S = 120.0


def read_kv_secret(config: WorkerConfig, environ: Mapping[str, str]) -> str | None:
    """The pool's KV secret from ``--kv-secret-file`` or ``GENPOOL_KV_SECRET_FILE`` (the
    operator mounts ``<pool>-kv-secret`` there); None when neither names a file, or the
    env's file is absent (the operator's volume is optional: an operator without an admin
    token writes no Secret). A flag's file missing, or an empty file, is an error: a worker
    must not serve its KV open by mistake."""
    path = config.kv_secret_file or environ.get(KV_SECRET_FILE_ENV) or None
    if path is None:
        return None
    if not config.kv_secret_file and not Path(path).is_file():
        log.warning("no KV secret at %s: KV pulls and cancels are open", path)
        return None
    secret = Path(path).read_text().strip()
    if not secret:
        raise ValueError(f"the KV secret file {path} is empty")
    return secret


def drain_timeout_s(environ: Mapping[str, str]) -> float:
    """How long SIGTERM waits for open requests before it cuts them (503) and exits: the
    pod's drain timeout (``GENPOOL_DRAIN_TIMEOUT_S``, as the preStop hook reads it)."""
    return default_timeout(environ)


class ServerProcess:
    """uvicorn's server, whose SIGTERM also stops admission at once (new requests get a
    503) and gives open requests the drain timeout to finish: then the engine stops and
    every one still open ends with a 503 error (a stream with its error event), so the
    process never outlives the timeout. The engine stops it from its own thread when it
    dies."""

    def __init__(self, config: Any, engine: GenEngine, drain_timeout_s: float) -> None:
        import uvicorn

        outer = self

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                outer.on_sigterm()
                super().handle_exit(sig, frame)

        self._engine, self._drain_timeout_s = engine, drain_timeout_s
        # uvicorn's own cut-off only backs ours up: ours ends the requests cleanly first.
        config.timeout_graceful_shutdown = drain_timeout_s + SHUTDOWN_MARGIN_S
        config.timeout_keep_alive = KEEP_ALIVE_S
        self._server = Server(config)
        self._cutter: threading.Thread | None = None

    def on_sigterm(self) -> None:
        self._engine.is_draining = True
        if self._cutter is None:
            self._cutter = threading.Thread(target=self._cut_at_deadline, daemon=True)
            self._cutter.start()

    def _cut_at_deadline(self) -> None:
        deadline = time.monotonic() + self._drain_timeout_s
        while self._engine.inflight > 0 and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
        self._engine.stop(timeout=SHUTDOWN_MARGIN_S)

    def run(self) -> None:
        self._server.run()

    def stop(self) -> None:
        self._server.should_exit = True  # read by uvicorn's main loop (thread-safe)
