"""An idle keep-alive connection to the worker outlives its clients' pools' idle expiry
(docs/worker.md#http-api): the worker never closes a connection a gateway or llm-d's sidecar
may be sending its next request on, which would fail that request with a reset."""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.worker.pd_support import worker_process

# Past uvicorn's default keep-alive (5 s), the one that raced a gateway's reused connection.
IDLE_S = 6.0


def test_an_idle_connection_stays_open_for_the_next_request(tmp_path: Path) -> None:
    with worker_process(tmp_path) as (url, _process):
        parts = urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        try:
            connection.request("GET", "/v1/models")
            first = connection.getresponse()
            assert first.status == 200 and first.read()
            sock = connection.sock
            time.sleep(IDLE_S)  # the idle time is what is tested, not a wait for a state
            # On the same socket: http.client reconnects only after a close it saw.
            connection.request("GET", "/v1/models")
            second = connection.getresponse()
            assert second.status == 200 and second.read()
            assert connection.sock is sock
        finally:
            connection.close()
