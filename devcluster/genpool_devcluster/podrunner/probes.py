"""Readiness, liveness and startup probes, and the httpGet/exec handlers that preStop shares.

Each container's probe is a small state machine driven by the pod worker's loop: `due()` says
when to run, `record()` applies successThreshold/failureThreshold. Actions are synchronous with
the probe's timeout; they run in the pod's worker thread, so one slow probe delays only its pod.
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
Obj = dict[str, Any]
DEFAULTS = {
    "initialDelaySeconds": 0,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}


class Target:
    """Where a container lives, for probes and hooks: its IP, ports, env and working dir."""

    def __init__(self, ip: str, container: Obj, env: Mapping[str, str], cwd: Path) -> None:
        self.ip = ip
        self.container = container
        self.env = dict(env)
        self.cwd = cwd

    def port(self, value: int | str) -> int:
        if isinstance(value, int) or str(value).isdigit():
            return int(value)
        for p in self.container.get("ports") or []:
            if p.get("name") == value:
                return int(p["containerPort"])
        raise ValueError(f"no container port named {value!r}")


def http_get(action: Obj, target: Target, timeout: float) -> tuple[bool, str]:
    host = action.get("host") or target.ip
    port = target.port(action.get("port", 80))
    conn: http.client.HTTPConnection
    if str(action.get("scheme", "HTTP")).upper() == "HTTPS":
        ctx = ssl._create_unverified_context()  # the kubelet does not verify probe certs either
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"User-Agent": "kube-probe/1.35", "Accept": "*/*"}
    headers.update({h["name"]: h["value"] for h in action.get("httpHeaders") or []})
    try:
        conn.request("GET", action.get("path") or "/", headers=headers)
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as err:
        return False, f"Get http://{host}:{port}{action.get('path', '/')}: {err}"
    finally:
        conn.close()
    return 200 <= status < 400, f"HTTP probe failed with statuscode: {status}"


def tcp_socket(action: Obj, target: Target, timeout: float) -> tuple[bool, str]:
    host = action.get("host") or target.ip
    port = target.port(action["port"])
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, ""
    except OSError as err:
        return False, f"dial tcp {host}:{port}: {err}"


def exec_command(action: Obj, target: Target, timeout: float) -> tuple[bool, str]:
    """Runs in the container's environment (env, cwd, venv-first PATH), like `kubectl exec`."""
    from .process import StartError, resolve_executable

    argv = list(action.get("command") or [])
    if not argv:
        return False, "exec action without a command"
    try:
        exe = resolve_executable(argv[0], target.env.get("PATH", ""))
        res = subprocess.run(
            argv,
            executable=exe,
            env=target.env,
            cwd=target.cwd,
            capture_output=True,
            timeout=max(timeout, 0.1),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False, f"command timed out after {timeout:g}s"
    except (StartError, OSError) as err:
        return False, str(err)
    out = (res.stdout + res.stderr).decode(errors="replace").strip()[-500:]
    return res.returncode == 0, f"exit code {res.returncode}: {out}"


def run_handler(handler: Obj, target: Target, timeout: float) -> tuple[bool, str]:
    """An exec/httpGet/tcpSocket/sleep handler (probe action or lifecycle hook)."""
    if "exec" in handler:
        return exec_command(handler["exec"], target, timeout)
    if "httpGet" in handler:
        return http_get(handler["httpGet"], target, timeout)
    if "tcpSocket" in handler:
        return tcp_socket(handler["tcpSocket"], target, timeout)
    if "sleep" in handler:
        time.sleep(min(float(handler["sleep"].get("seconds", 0)), timeout))
        return True, ""
    # grpc and anything newer: unsupported here, so it must not block the pod.
    log.warning("unsupported handler %s: treated as success", sorted(handler))
    return True, ""


class Probe:
    """One probe of one container run; a restarted container gets a fresh Probe."""

    def __init__(self, kind: str, spec: Obj, started: float) -> None:
        self.kind = kind
        self.spec = {**DEFAULTS, **spec}
        self.next_at = started + float(self.spec["initialDelaySeconds"])
        self.successes = 0
        self.failures = 0
        self.result: bool | None = None  # None until the thresholds say otherwise
        self.message = ""

    @property
    def timeout(self) -> float:
        return float(self.spec["timeoutSeconds"])

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def run(self, target: Target) -> bool | None:
        ok, msg = run_handler(self.spec, target, self.timeout)
        return self.record(ok, msg, time.monotonic())

    def record(self, ok: bool, message: str, now: float) -> bool | None:
        self.next_at = now + float(self.spec["periodSeconds"])
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec["successThreshold"]):
                self.result = True
        else:
            self.successes, self.failures = 0, self.failures + 1
            self.message = message
            if self.failures >= int(self.spec["failureThreshold"]):
                self.result = False
        return self.result
