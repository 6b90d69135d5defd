"""Many fake GEN workers in one asyncio process, each on its own loopback address.

They speak just enough of the worker's HTTP contract for the operator's scrape and
push paths (``GET /statlines``, ``GET /config``, ``PUT /config``) so that a scrape
round over hundreds of pods can be measured and tested without hundreds of models.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

STATLINE = (
    "gen_preemption stats t={t:.1f} mode=target_output_tps T=8.00 residents=20 active=16 "
    "paused=4 cap=6 headroom=6 waiters=3 at_risk=1 X=0.84 below_target=0.115/0.121 "
    "credit=3.40 victims=laxity:40,below_target:10,sacrificed:7 mean_laxity=1.27 "
    "laxity_resumes=38 forced_resumes=17 paused_below_target=1 completed=180/5230 "
    "pauses=57/2110"
)


@dataclass
class FakeWorker:
    host: str
    port: int
    token: str | None = None
    t: float = 30.0
    config: dict[str, Any] = field(
        default_factory=lambda: {"generation": 0, "resident_headroom": 6, "paused_cap": 6}
    )
    puts: int = 0


async def _handle(
    worker: FakeWorker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
            length = int(headers.get("content-length", "0") or 0)
            body = await reader.readexactly(length) if length else b""
            status, payload, ctype = _respond(worker, method, path, headers, body)
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.CancelledError):
        pass  # client went away, or the fleet is stopping
    finally:
        writer.close()


def _respond(
    worker: FakeWorker, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, bytes, str]:
    if method == "GET" and path == "/statlines":
        return 200, STATLINE.format(t=worker.t).encode(), "text/plain"
    if method == "GET" and path == "/config":
        return 200, json.dumps(worker.config).encode(), "application/json"
    if method == "PUT" and path == "/config":
        if worker.token and headers.get("authorization") != f"Bearer {worker.token}":
            return 401, b'{"error": "token"}', "application/json"
        update = json.loads(body)
        if update.get("generation", 0) < worker.config["generation"]:
            return 409, b'{"error": "stale generation"}', "application/json"
        worker.config.update(update)
        worker.puts += 1
        return 200, json.dumps(worker.config).encode(), "application/json"
    return 404, b"{}", "application/json"


class FakeWorkerFleet:
    """``start(n)`` binds n workers on 127.0.1.1, 127.0.1.2, ... port ``port``."""

    def __init__(self, *, port: int = 18000, token: str | None = None) -> None:
        self.port = port
        self.token = token
        self.workers: list[FakeWorker] = []
        self._servers: list[asyncio.base_events.Server] = []

    async def start(self, count: int) -> list[FakeWorker]:
        for i in range(count):
            host = f"127.0.{1 + i // 250}.{1 + i % 250}"
            worker = FakeWorker(host, self.port, self.token)

            async def handler(r, w, worker=worker):  # type: ignore[no-untyped-def]
                await _handle(worker, r, w)

            self._servers.append(await asyncio.start_server(handler, host, self.port))
            self.workers.append(worker)
        return self.workers

    def advance(self, seconds: float = 30.0) -> None:
        for worker in self.workers:
            worker.t += seconds

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for server in self._servers:
            await server.wait_closed()


async def _serve(count: int, port: int) -> None:
    fleet = FakeWorkerFleet(port=port)
    await fleet.start(count)
    print("ready", flush=True)
    while True:  # advance the stat lines as real workers would, every 30 s
        await asyncio.sleep(30)
        fleet.advance()


def main() -> None:
    """``python -m bench.fake_workers COUNT PORT``: serve until killed (a separate
    process, so a benchmark's CPU time is the operator side alone)."""
    import sys

    count, port = int(sys.argv[1]), int(sys.argv[2])
    asyncio.run(_serve(count, port))


if __name__ == "__main__":
    main()
