"""Kubeconfigs (the admin's token, the kubelet's client cert) and a stdlib-only API probe (the CLI
works without the kubernetes client)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

# Called between polls; raises to abort the wait (a component died, or the deadline passed).
Watchdog = Callable[[], None]
POLL_S = 0.25


def render(server: str, ca_crt: Path, user: str, credentials: dict[str, str]) -> str:
    """A kubeconfig for one user: `credentials` is its `user` entry ({"token": ...}, or the
    kubelet's client-certificate and client-key paths)."""
    ca = base64.b64encode(ca_crt.read_bytes()).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "genpool-dev", "cluster": {"server": server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "genpool-dev", "context": {"cluster": "genpool-dev", "user": user}}],
        "current-context": "genpool-dev",
    }
    return json.dumps(doc, indent=2) + "\n"  # JSON is YAML: no yaml dependency needed


def write_file(path: Path, text: str, mode: int = 0o600) -> None:
    """Write then rename, so a reader (a restarting component) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def write(path: Path, server: str, ca_crt: Path, token: str) -> None:
    """The admin kubeconfig (a token in system:masters)."""
    write_file(path, render(server, ca_crt, "admin", {"token": token}))


def load(path: Path) -> tuple[str, str, str]:
    """(server, CA PEM, token) of the current context of a kubeconfig this module wrote."""
    doc = json.loads(path.read_text())
    cluster = doc["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    return cluster["server"], ca, doc["users"][0]["user"]["token"]


class Api:
    def __init__(self, server: str, ca_crt: Path | None, token: str, ca_pem: str = "") -> None:
        self.server = server
        self.token = token
        self.ctx = ssl.create_default_context(
            cafile=str(ca_crt) if ca_crt else None, cadata=ca_pem or None
        )

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Api:
        server, ca, token = load(path)
        return cls(server, None, token, ca_pem=ca)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (OSError, TimeoutError):
            return 0, b""

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def wait_ready(self, check: Watchdog) -> None:
        _poll(self.ready, check)

    def wait_ok(self, path: str, check: Watchdog) -> None:
        _poll(lambda: self.get(path)[0] == 200, check)

    def wait_node_ready(self, name: str, check: Watchdog) -> None:
        """Until the Node reports the Ready condition True (the kubelet and its runtime work)."""

        def ready() -> bool:
            code, body = self.get(f"/api/v1/nodes/{name}")
            if code != 200:
                return False
            conditions = json.loads(body).get("status", {}).get("conditions", [])
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

        _poll(ready, check)

    def wait_default_sa(self, check: Watchdog) -> None:
        """The controller-manager works once it has made the `default` ServiceAccount."""
        self.wait_ok("/api/v1/namespaces/default/serviceaccounts/default", check)


def wait_etcd(port: int, check: Watchdog) -> None:
    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    _poll(healthy, check)


def _poll(ok: Callable[[], bool], check: Watchdog) -> None:
    while not ok():
        check()
        time.sleep(POLL_S)
