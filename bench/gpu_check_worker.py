"""The serving check's worker process (``bench/gpu_serving.py``): ``genpool-worker`` started
on a free loopback port, waited for (``/ready``, with a deadline; its exit or its log's
tail is the error), its model time read from ``/metrics``, and stopped. Torch-free."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
LOG = Path(tempfile.gettempdir()) / f"genpool-gpu-serving-worker-{os.getpid()}.log"
STEP = "genpool_step_seconds"


def child_env() -> dict[str, str]:
    """The checkout's packages first, for a worker or client run from an uninstalled tree."""
    paths = [str(ROOT / p) for p in ("", "worker", "core", "sim")]
    return os.environ | {"PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def worker_process(args: list[str], timeout_s: float) -> Iterator[str]:
    """``genpool-worker ARGS`` on a free port, its URL once ready; stopped at the end."""
    port = free_port()
    cmd = [sys.executable, "-m", "genpool_worker.worker_cli", *args,
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with LOG.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited ({proc.returncode}): {log_tail()}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the worker was not ready within {timeout_s:.0f} s: {log_tail()}")


def log_tail(chars: int = 1500) -> str:
    return LOG.read_text(errors="replace")[-chars:] if LOG.is_file() else "(no log)"


def engine_model_time(url: str) -> tuple[float, float]:
    """The worker's ``genpool_step_seconds`` sum and count (model work of every pass)."""
    values = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith((f"{STEP}_sum", f"{STEP}_count")):
            values[line.partition("{")[0].partition(" ")[0]] = float(line.rsplit(" ", 1)[1])
    return values.get(f"{STEP}_sum", 0.0), values.get(f"{STEP}_count", 0.0)
