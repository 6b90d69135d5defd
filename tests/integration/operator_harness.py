"""Running the operator as a local process against the devcluster, and small waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client

from genpool_core.names import API_GROUP, API_PLURAL, API_VERSION, pool_label_selector
from tests.conftest import Kubectl

GROUP, VERSION, PLURAL = API_GROUP, API_VERSION, API_PLURAL
CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "genpool.dev_genpools.yaml"


def install_genpool_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/genpools.genpool.dev")


ADMIN_TOKEN = "integration-admin-token"
T = TypeVar("T")


class OperatorProcess:
    """``genpool-operator`` for one namespace, as a child process with its own log."""

    def __init__(self, kubeconfig: Path, namespace: str, log_path: Path) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "GENPOOL_ADMIN_TOKEN": ADMIN_TOKEN,
            "GENPOOL_WORKER_IMAGE": "genpool/worker:test",
        }
        log = self.log_path.open("ab")
        argv = [sys.executable, "-m", "genpool_operator.main", "--namespace", self.namespace]
        self.proc = subprocess.Popen(
            [*argv, "--liveness-port", "0"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers run, as when a node dies mid-reconcile."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def genpool(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GenPool",
        "metadata": {"name": name},
        "spec": spec,
    }


def synthetic_spec(**overrides: Any) -> dict[str, Any]:
    """A pool of synthetic-model workers: real worker processes, no weights to load."""
    spec: dict[str, Any] = {
        "replicas": 1,
        "model": "synthetic:tiny",
        "accelerator": "none",
        "engine": {"maxBatchSize": 8},
        "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 20},
        "tuning": {"intervalSeconds": 2},
        "drain": {"timeoutSeconds": 5},
    }
    spec.update(overrides)
    return spec


def get_pool(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    objs = client.CustomObjectsApi(api)
    pool: dict[str, Any] = objs.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return pool


def create_pool(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    objs = client.CustomObjectsApi(api)
    created: dict[str, Any] = objs.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    return created


def ready_pods(api: client.ApiClient, namespace: str, pool: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=pool_label_selector(pool)
    )
    return [
        p
        for p in pods.items
        if p.status.pod_ip
        and not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
