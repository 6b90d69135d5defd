"""A small Kubernetes REST client on httpx: JSON dicts in and out, list+watch.

The pod runner works on raw pod JSON (camelCase, exactly what the API serves), so the typed
kubernetes client's models would only get in the way; its `create_namespaced_binding` also fails
to deserialize the Status the binding subresource answers with.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass
class Credentials:
    """What a kubeconfig's current context says about how to reach the apiserver."""

    server: str
    ca_pem: str = ""  # empty: system roots, or no verification when insecure
    insecure: bool = False
    token: str = ""
    cert_file: str = ""
    key_file: str = ""

    @property
    def host_port(self) -> tuple[str, int]:
        url = urlsplit(self.server)
        return url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)


def _data_or_file(entry: Obj, key: str, base: Path) -> str:
    if entry.get(f"{key}-data"):
        return base64.b64decode(str(entry[f"{key}-data"])).decode()
    if entry.get(key):
        return (base / str(entry[key])).read_text()
    return ""


def load_kubeconfig(path: Path, secrets_dir: Path) -> Credentials:
    """Credentials of the current context; client-cert data lands in files httpx can load."""
    doc = yaml.safe_load(path.read_text())
    base = path.parent
    ctx_name = doc.get("current-context") or doc["contexts"][0]["name"]
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
    users = doc.get("users", [])
    user: Obj = next((u["user"] for u in users if u["name"] == ctx.get("user")), {})
    creds = Credentials(
        server=cluster["server"].rstrip("/"),
        ca_pem=_data_or_file(cluster, "certificate-authority", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=user.get("token") or "",
    )
    if not creds.token and user.get("tokenFile"):
        creds.token = (base / user["tokenFile"]).read_text().strip()
    cert = _data_or_file(user, "client-certificate", base)
    if cert:
        secrets_dir.mkdir(parents=True, exist_ok=True)
        creds.cert_file, creds.key_file = (
            str(secrets_dir / "client.crt"),
            str(secrets_dir / "client.key"),
        )
        _write_private(Path(creds.cert_file), cert)
        _write_private(Path(creds.key_file), _data_or_file(user, "client-key", base))
    return creds


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


class Kube:
    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        verify: Any = True
        if creds.insecure:
            verify = False
        elif creds.ca_pem:
            import ssl

            verify = ssl.create_default_context(cadata=creds.ca_pem)
        headers = {"Accept": "application/json"}
        if creds.token:
            headers["Authorization"] = f"Bearer {creds.token}"
        cert = (creds.cert_file, creds.key_file) if creds.cert_file else None
        self.http = httpx.Client(
            base_url=creds.server,
            verify=verify,
            cert=cert,
            headers=headers,
            timeout=httpx.Timeout(15.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    def close(self) -> None:
        self.http.close()

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        params: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        content = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        resp = self.http.request(method, path, content=content, params=params, headers=headers)
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, _message(resp))
        return resp.json() if resp.content else {}

    def get(self, path: str, params: Obj | None = None) -> Obj:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Obj) -> Obj:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        return self.request("DELETE", path, body)

    def watch(self, path: str, params: Obj, timeout_s: int = 60) -> Iterator[Obj]:
        """One watch request's events, until the server ends it (timeout_s) or an error."""
        query = {**params, "watch": "true", "allowWatchBookmarks": "true"}
        query["timeoutSeconds"] = str(timeout_s)
        timeout = httpx.Timeout(15.0, read=timeout_s + 30.0)
        with self.http.stream("GET", path, params=query, timeout=timeout) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise ApiError(resp.status_code, _message(resp))
            for line in resp.iter_lines():
                if line.strip():
                    yield json.loads(line)


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("message") or resp.text)
    except ValueError:
        return resp.text[:500]


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}" + (f"/{sub}" if sub else "")
