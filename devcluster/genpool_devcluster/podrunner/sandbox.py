"""A pod's "sandbox" on this machine: a loopback IP, a directory tree, volumes and API access.

Each pod gets its own 127.0.x.y address (Linux routes all of 127/8 to `lo`), so several pods can
bind the same port. Volumes: emptyDir, configMap and secret volumes become directories under the
pod dir; a plain process cannot see them at their mountPath, so env values that name a path under
a mountPath are rewritten to the pod's directory instead (see docs/podrunner.md).
"""

from __future__ import annotations

import base64
import fcntl
import ipaddress
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .kube import Credentials, Kube

Obj = dict[str, Any]
FIRST_IP = int(ipaddress.IPv4Address("127.0.0.10"))
LAST_IP = int(ipaddress.IPv4Address("127.0.255.254"))
TOKEN_SECONDS = 3607  # the kubelet's value; the apiserver may extend it (then warns clients)


class IpPool:
    """127.0.0.10 upward; the lowest free address is handed out, released ones are reused.

    "Free" is machine-wide: each address in use is an flock on a file in a shared directory, so
    two runners (a dev cluster and a test cluster) never give out the same address, and a
    runner that dies releases its addresses with its file descriptors.
    """

    def __init__(self, lock_dir: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.dir = lock_dir or Path(tempfile.gettempdir()) / "genpool-podrunner-ips"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.held: dict[str, tuple[str, int]] = {}  # ip -> (pod uid, locked fd)

    def claim(self, uid: str, preferred: str = "") -> str:
        with self.lock:
            mine = [ip for ip, (owner, _) in self.held.items() if owner == uid]
            if mine:
                return mine[0]
            if preferred and _in_range(preferred) and self._take(preferred, uid):
                return preferred
            for n in range(FIRST_IP, LAST_IP + 1):
                ip = str(ipaddress.IPv4Address(n))
                if not ip.endswith((".0", ".255")) and ip not in self.held and self._take(ip, uid):
                    return ip
        raise RuntimeError("no free loopback address")

    def _take(self, ip: str, uid: str) -> bool:
        fd = os.open(self.dir / ip, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self.held[ip] = (uid, fd)
        return True

    def release(self, uid: str) -> None:
        with self.lock:
            for ip in [ip for ip, (owner, _) in self.held.items() if owner == uid]:
                os.close(self.held.pop(ip)[1])  # closing drops the flock


def _in_range(ip: str) -> bool:
    try:
        return FIRST_IP <= int(ipaddress.IPv4Address(ip)) <= LAST_IP
    except ValueError:
        return False


class PodDir:
    def __init__(self, root: Path, pod: Obj) -> None:
        meta = pod["metadata"]
        self.path = root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        self.work = self.path / "work"
        self.tmp = self.path / "tmp"
        self.volumes = self.path / "volumes"
        self.kubeconfig = self.path / "kubeconfig"
        self.sa_dir = self.path / "serviceaccount"

    def create(self) -> None:
        for d in (self.work, self.tmp, self.volumes, self.sa_dir):
            d.mkdir(parents=True, exist_ok=True)

    def log_dir(self, container: str) -> Path:
        return self.path / "logs" / container

    def message_dir(self, container: str) -> Path:
        """Termination-message files, one a run; kept with the logs."""
        return self.path / "termination" / container

    def cleanup(self) -> None:
        """Drop volumes and scratch space; keep logs (and the tree) for post-mortems."""
        for d in (self.volumes, self.tmp, self.work, self.sa_dir):
            shutil.rmtree(d, ignore_errors=True)
        self.kubeconfig.unlink(missing_ok=True)


def materialize_volumes(pod: Obj, pdir: PodDir, kube: Kube) -> dict[str, Path]:
    """emptyDir/configMap/secret volumes as directories; name -> local path."""
    ns = pod["metadata"]["namespace"]
    out: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        path = pdir.volumes / vol["name"]
        path.mkdir(parents=True, exist_ok=True)
        out[vol["name"]] = path
        for kind, plural, key in (
            ("configMap", "configmaps", "name"),
            ("secret", "secrets", "secretName"),
        ):
            src = vol.get(kind)
            if src is None:
                continue
            try:
                obj = kube.get(f"/api/v1/namespaces/{ns}/{plural}/{src.get(key, '')}")
            except Exception:
                if src.get("optional"):
                    continue
                raise
            _write_items(path, obj, src.get("items"), decode=kind == "secret")
    return out


def _write_items(path: Path, obj: Obj, items: list[Obj] | None, decode: bool) -> None:
    data = {
        k: base64.b64decode(v) if decode else v.encode() for k, v in (obj.get("data") or {}).items()
    }
    for k, v in (obj.get("binaryData") or {}).items():
        data[k] = base64.b64decode(v)
    wanted = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
    for key, rel in wanted:
        if key in data:
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[key])


def remap_paths(env: dict[str, str], container: Obj, volumes: dict[str, Path]) -> dict[str, str]:
    """Env values that name a path under a volume's mountPath point at the local directory."""
    mounts = []
    for m in container.get("volumeMounts") or []:
        if m["name"] in volumes:
            local = volumes[m["name"]] / m.get("subPath", "")
            mounts.append((m["mountPath"].rstrip("/") or "/", local))
    mounts.sort(key=lambda m: -len(m[0]))  # the deepest mount wins
    out = {}
    for name, value in env.items():
        for mount, local in mounts:
            if value == mount or value.startswith(mount + "/"):
                local.mkdir(parents=True, exist_ok=True)
                value = str(local) + value[len(mount) :]
                break
        out[name] = value
    return out


class ApiAccess:
    """A bound ServiceAccount token for the pod, written as a kubeconfig in the pod dir."""

    def __init__(self, kube: Kube, creds: Credentials, pod: Obj, pdir: PodDir) -> None:
        self.kube, self.creds, self.pod, self.pdir = kube, creds, pod, pdir
        self.refresh_at = 0.0

    @staticmethod
    def wanted(pod: Obj) -> bool:
        return pod["spec"].get("automountServiceAccountToken") is not False

    def refresh_if_due(self) -> None:
        if time.time() >= self.refresh_at:
            self._refresh()

    def _refresh(self) -> None:
        meta = self.pod["metadata"]
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        res = self.kube.post(
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token", body
        )
        token = res["status"]["token"]
        expires = _parse_time(res["status"].get("expirationTimestamp", "")) or time.time() + 3600
        self.refresh_at = time.time() + 0.8 * max(
            expires - time.time(), 60
        )  # as the kubelet: at 80%
        self._write(token, meta["namespace"])

    def _write(self, token: str, namespace: str) -> None:
        cluster: Obj = {"server": self.creds.server}
        if self.creds.insecure:
            cluster["insecure-skip-tls-verify"] = True
        elif self.creds.ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(
                self.creds.ca_pem.encode()
            ).decode()
            _atomic(self.pdir.sa_dir / "ca.crt", self.creds.ca_pem)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "genpool-dev", "cluster": cluster}],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {"cluster": "genpool-dev", "user": "pod", "namespace": namespace},
                }
            ],
            "current-context": "pod",
        }
        _atomic(self.pdir.kubeconfig, json.dumps(doc, indent=2) + "\n")
        _atomic(self.pdir.sa_dir / "token", token)
        _atomic(self.pdir.sa_dir / "namespace", namespace)


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _parse_time(text: str) -> float:
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
