"""What the P/D tests share: llm-d's sidecar exchange written out in Python (the way its
pd-sidecar speaks to the two legs; docs/llm-d-interop-notes.md), worker processes (one
with its clock skewed), a TCP proxy that can stall a stream midway, and metric reads."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.polling import wait_for

# The prefill leg's kv_transfer_params as llm-d's nixlv2 connector sends them.
SIDECAR_PREFILL_PARAMS = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}  # fmt: skip


def sidecar_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's body as the sidecar changes it for the prefill leg."""
    leg = copy.deepcopy(body)
    leg["kv_transfer_params"] = dict(SIDECAR_PREFILL_PARAMS)
    leg["stream"] = False
    leg.pop("stream_options", None)
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    if "min_tokens" in leg:
        leg["min_tokens"] = 1
    return leg


def sidecar_exchange(
    prefill_url: str, decode_url: str, path: str, body: dict[str, Any]
) -> tuple[dict[str, Any], httpx.Response]:
    """The prefill leg, then the decode leg with the prefill response's top-level
    ``kv_transfer_params`` copied unchanged: (prefill response JSON, decode response)."""
    with httpx.Client(timeout=60) as http:
        prefill = http.post(prefill_url + path, json=sidecar_prefill_body(body))
        assert prefill.status_code == 200, prefill.text
        answer = prefill.json()
        decode_body = copy.deepcopy(body)
        if answer.get("kv_transfer_params") is not None:
            decode_body["kv_transfer_params"] = answer["kv_transfer_params"]
        return answer, http.post(decode_url + path, json=decode_body)


def endpoint(url_or_port: str | int) -> str:
    """A worker's (or a local proxy's) ``host:port``, as a prefill endpoint is spelled."""
    if isinstance(url_or_port, int):
        return f"127.0.0.1:{url_or_port}"
    return url_or_port.removeprefix("http://")


def tell_prefillers(decode_url: str, *prefillers: str | int) -> None:
    """The decode worker knows these prefill endpoints (as the operator's ``PUT
    /prefillers`` tells it): the only ones it pulls from or sends legs to."""
    endpoints = [endpoint(p) for p in prefillers]
    reply = httpx.put(decode_url + "/prefillers", json={"endpoints": endpoints}, timeout=10)
    assert reply.status_code == 200, reply.text


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the /metrics samples named ``name`` that carry ``labels`` (0: none)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        key, _, value = line.rpartition(" ")
        sample, _, label_text = key.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if sample == name and labels.items() <= found.items():
            total += float(value)
    return total


def wait_no_held_kv(url: str) -> None:
    """Nothing held on ``url`` any more: no export and no used KV block."""

    def clean() -> bool:
        return (
            metric(url, "genpool_kv_exports_held") == 0
            and metric(url, "genpool_kv_blocks_used") == 0
        )

    wait_for(clean, f"{url} to hold no KV", 20, interval=0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def worker_process(
    tmp: Path,
    *args: str,
    clock_skew_s: float = 0.0,
    site_code: str = "",
    env_extra: dict[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``genpool-worker`` process on the synthetic model; ``clock_skew_s`` shifts its
    wall clock (a sitecustomize on its path), as another pod's clock may be; ``site_code``
    runs in that sitecustomize too (a fault a test injects)."""
    env = dict(os.environ) | (env_extra or {})
    code = site_code
    if clock_skew_s:
        code += f"import time\n_real = time.time\ntime.time = lambda: _real() + {clock_skew_s!r}\n"
    if code:
        site = tmp / f"site{free_port()}"
        site.mkdir()
        (site / "sitecustomize.py").write_text(code)
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    port = free_port()
    command = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", "synthetic:test",
               "--port", str(port), "--synthetic-time-scale", "0.2", *args]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, f"the worker exited with {process.returncode}"
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(url + "/ready", timeout=1).status_code == 200
        return False

    try:
        wait_for(ready, f"the worker on {port} to be ready", 60, interval=0.1)
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


class StallingProxy:
    """Forwards TCP to ``upstream``; once armed, a connection's reply stalls after
    ``limit`` bytes (``stalled`` is set), as a pull does whose far side dies midway."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.limit: int | None = None
        self.stalled = threading.Event()
        self.release = threading.Event()  # closes a stalled connection
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the upstream is gone (killed): the client sees a closed socket
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, self.limit), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := src.recv(4096):
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: max(0, limit - sent)])
                    self.stalled.set()
                    self.release.wait(60)
                    return
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.release.set()
        self._server.close()
