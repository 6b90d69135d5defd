"""The interop run's child processes: llm-d's pd-sidecar and epp, GenPool workers; each logs
to <LOG_DIR>/<name>.log and is stopped when its ``running`` block ends."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genpool_devcluster.interop.common import LOG_DIR, WORKER_BIN, wait_for
from genpool_devcluster.procs import free_port


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return LOG_DIR / f"{self.name}.log"

    def start(self) -> Proc:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"\n==== {time.strftime('%F %T')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv, env={**os.environ, **self.env}, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)

    def tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def running(proc: Proc, ready: Callable[[], Any], what: str, timeout: float) -> Iterator[Proc]:
    """Start ``proc``, wait until ``ready()`` (SystemExit with its log tail if it exits)."""
    proc.start()
    try:

        def check() -> Any:
            if not proc.alive():
                raise SystemExit(f"{proc.name} exited:\n{proc.tail()}")
            return ready()

        wait_for(check, what, timeout)
        yield proc
    finally:
        proc.stop()


def sidecar_proc(bin_dir: Path, port: int, decoder_port: int, *extra: str) -> Proc:
    """llm-d's pd-sidecar: plain HTTP (its default is TLS with a self-signed certificate)."""
    argv = [
        str(bin_dir / "pd-sidecar"),
        f"--port={port}",
        f"--model-server-port={decoder_port}",
        "--kv-connector=nixlv2",
        "--secure-proxy=false",
        *extra,
    ]  # fmt: skip
    return Proc(f"pd-sidecar-{port}", argv)


def epp_proc(bin_dir: Path, config: str, *, pool: str, namespace: str, kubeconfig: Path | None,
             extra: tuple[str, ...] = (), binary: Path | None = None,
             ) -> tuple[Proc, int, int]:  # fmt: skip
    """llm-d's epp (``binary``, else ``bin_dir``/epp): plaintext ext_proc (as
    tests/integration/endpoint_picker.py runs GIE's), no metrics auth, no tracing, then
    ``extra`` flags; (proc, ext_proc port, metrics port)."""
    grpc_port, metrics_port = free_port(), free_port()
    argv = [
        str(binary or bin_dir / "epp"), "--pool-name", pool, "--pool-namespace", namespace,
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(free_port()),
        "--metrics-port", str(metrics_port), "--secure-serving=false",
        "--metrics-endpoint-auth=false", "--tracing=false", "--enable-pprof=false",
        "--config-text", config, "--v=4", *extra,
    ]  # fmt: skip
    env = {"KUBECONFIG": str(kubeconfig)} if kubeconfig else {}
    return Proc("epp", argv, env), grpc_port, metrics_port


def worker_proc(name: str, model: str, port: int, *extra: str) -> Proc:
    """A ``genpool-worker`` on 127.0.0.1:<port> (``extra``: e.g. ``--role prefill``)."""
    argv = [str(WORKER_BIN), "--model", model, "--host", "127.0.0.1", "--port", str(port),
            *extra]  # fmt: skip
    return Proc(name, argv)
