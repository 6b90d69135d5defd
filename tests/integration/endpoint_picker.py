"""The Gateway API Inference Extension's endpoint picker (EPP), built from its Go module and
run as a local process against the devcluster.

The picker is GIE's own ``cmd/epp`` at the version of the vendored InferencePool CRD, built
unmodified with ``go build`` (minutes on a small machine; cached like the control plane's
binaries). It watches the InferencePool named by ``--pool-name``, lists the Pods its
selector matches and scrapes ``http://<podIP>:<targetPort>/metrics``; the devcluster's pod
IPs are loopback addresses, so it reaches the worker processes directly.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GIE_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
GIE_VERSION = "v1.2.0"  # tests/data/crds/fetch-inferencepool-crd.sh pins the same
CACHE_DIR = Path(os.environ.get("GENPOOL_EPP_CACHE", "~/.cache/genpool/epp")).expanduser()
# The scheduling config GIE's inferencepool Helm chart ships (default-plugins.yaml); v1.2.0's
# picker dereferences a nil config when started without one.
DEFAULT_PLUGINS = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""
# A sample line of the picker's /metrics: inference_pool_ready_pods{name="chat"} 2
POOL_GAUGE = re.compile(r'^(inference_pool_\w+)\{name="([^"]+)"\} (\S+)$', re.MULTILINE)


def epp_binary() -> Path:
    """``cmd/epp`` of GIE_VERSION, built once into CACHE_DIR (under a lock: one build)."""
    dest = CACHE_DIR / GIE_VERSION / "epp"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not dest.exists():
            _build(dest)
    return dest


def _build(dest: Path) -> None:
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    with tempfile.TemporaryDirectory(prefix="genpool-epp-") as work:
        root = Path(work)
        # `go mod download` needs a module to run in; the source lands in the module cache.
        subprocess.run(["go", "mod", "init", "genpool.dev/epp-build"], cwd=root, check=True)
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{GIE_MODULE}@{GIE_VERSION}"],
            cwd=root, env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        # The module cache is read-only; build a writable copy with its own go.mod/go.sum.
        src = root / "src"
        shutil.copytree(json.loads(out.stdout)["Dir"], src)
        for path in [src, *src.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        partial = dest.with_suffix(".partial")
        build = ["nice", "-n", "10", "go", "build", "-p", "2", "-o", str(partial), "./cmd/epp"]
        subprocess.run(build, cwd=src, env=env, check=True)
        partial.replace(dest)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EndpointPicker:
    """One ``epp`` for one InferencePool, with its own log and free ports."""

    def __init__(
        self,
        binary: Path,
        kubeconfig: Path,
        namespace: str,
        pool: str,
        log: Path,
        *,
        plaintext: bool = False,
    ) -> None:
        self.argv = [str(binary), "--pool-name", pool, "--pool-namespace", namespace]
        if plaintext:
            # ext_proc without TLS: v1.2.0 otherwise serves a self-signed certificate that
            # names no host, which gRPC clients other than Envoy (verification off) reject.
            self.argv.append("--secure-serving=false")
        self.kubeconfig = kubeconfig
        self.log_path = log
        self.grpc_port = free_port()  # ext_proc, where a gateway asks for an endpoint
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EndpointPicker:
        flags = [
            "--grpc-port", str(self.grpc_port),
            "--grpc-health-port", str(free_port()),
            "--metrics-port", str(self.metrics_port),
            "--config-text", DEFAULT_PLUGINS,
            # The picker's own /metrics without a ServiceAccount token review.
            "--metrics-endpoint-auth=false",
            "--tracing=false",
            "--v=4",  # logs each pod it starts scraping, with its metrics host
        ]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.argv, *flags], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def pool_gauges(self, text: str, pool: str) -> dict[str, float]:
        """The picker's ``inference_pool_*`` gauges for ``pool`` in its /metrics ``text``."""
        return {name: float(value) for name, of, value in POOL_GAUGE.findall(text) if of == pool}

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def endpoint_picker(
    kubeconfig: Path, namespace: str, pool: str, log: Path, *, plaintext: bool = False
) -> Iterator[EndpointPicker]:
    """An (unstarted) picker for ``pool``; stopped afterwards, its log's tail printed."""
    epp = EndpointPicker(epp_binary(), kubeconfig, namespace, pool, log, plaintext=plaintext)
    try:
        yield epp
    finally:
        epp.stop()
        print("\n".join(epp.log_text().splitlines()[-40:]))
