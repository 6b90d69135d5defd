"""The shared runner context, and a container process's full environment.

A pod's process gets: a small pass-through of the runner's environment (PATH with the venv first,
PYTHONPATH, HOME, locale, model caches), the service-link vars pointing at the apiserver,
KUBECONFIG for its ServiceAccount, TMPDIR in the pod dir, then the container's declared env. The
runner's own KUBECONFIG and credentials are never passed on.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .containers import Backoff
from .env import EnvResolver
from .kube import ApiError, Credentials, Kube
from .sandbox import IpPool, PodDir, remap_paths

Obj = dict[str, Any]
MARK_STATE = "GENPOOL_PODRUNNER_STATE"  # lets a restarted runner find its orphaned processes
MARK_POD = "GENPOOL_PODRUNNER_POD"
PASS_NAMES = {
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "TZ",
    "TERM",
    "OMP_NUM_THREADS",
    "GENPOOL_DATA_DIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    # The runner's own import path: the project's packages a pod imports are the ones the
    # runner imports (a git worktree sharing another checkout's editable venv names its
    # packages here, ahead of the venv's import hook).
    "PYTHONPATH",
}
PASS_PREFIXES = ("LC_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "CUDA_", "NVIDIA_", "XDG_")


@dataclass
class Context:
    kube: Kube
    creds: Credentials
    node_name: str
    state_dir: Path
    ips: IpPool
    backoff: Backoff
    base_env: dict[str, str]
    node_alloc: dict[str, str]
    host_ip: str = "127.0.0.1"


def base_env(extra: list[str]) -> dict[str, str]:
    """What pods inherit from the runner; `extra` names more variables (--pass-env)."""
    env = {k: v for k, v in os.environ.items() if k in PASS_NAMES or k.startswith(PASS_PREFIXES)}
    env.update({k: os.environ[k] for k in extra if k in os.environ})
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + ":" + os.environ.get("PATH", os.defpath)
    env.setdefault("HOME", str(Path.home()))
    return env


class Lookup:
    """ConfigMaps and Secrets for env resolution; None when absent."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def _get(self, plural: str, ns: str, name: str) -> Obj | None:
        try:
            return self.kube.get(f"/api/v1/namespaces/{ns}/{plural}/{name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def configmap(self, namespace: str, name: str) -> Obj | None:
        return self._get("configmaps", namespace, name)

    def secret(self, namespace: str, name: str) -> Obj | None:
        return self._get("secrets", namespace, name)


def service_env(creds: Credentials) -> dict[str, str]:
    """The `kubernetes` Service's link vars, pointing at the apiserver's own loopback address."""
    host, port = creds.host_port
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
    }


def container_env(
    ctx: Context,
    pod: Obj,
    spec: Obj,
    pdir: PodDir,
    volumes: dict[str, Path],
    kubeconfig: Path | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(process env, the vars $(VAR) may name in command/args); `pod` carries our status view."""
    service = service_env(ctx.creds)
    declared = EnvResolver(pod, Lookup(ctx.kube), ctx.node_alloc).resolve(spec, service)
    declared = remap_paths(declared, spec, volumes)
    env = dict(ctx.base_env)
    env["HOSTNAME"] = pod["spec"].get("hostname") or pod["metadata"]["name"]
    env["TMPDIR"] = str(pdir.tmp)
    env.update(service)
    if kubeconfig:
        env["KUBECONFIG"] = str(kubeconfig)
    env.update(declared)
    if "PATH" in declared:  # the project's tools stay first even when a pod sets PATH
        env["PATH"] = ctx.base_env["PATH"].split(":", 1)[0] + ":" + declared["PATH"]
    if not Path(env.get("HOME", "/nonexistent")).is_dir():
        env["HOME"] = ctx.base_env["HOME"]  # an image's HOME (/home/x) does not exist here
    env[MARK_STATE], env[MARK_POD] = str(ctx.state_dir), pod["metadata"]["uid"]
    return env, {**service, **declared}
