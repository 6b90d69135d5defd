"""Child processes of the control plane: start in their own process group, stop without orphans."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: int) -> None:
    """Ask the kernel to send `sig` when the supervisor dies, even by SIGKILL: no orphans."""
    # Not Linux (no prctl): `down` still kills what pids.json lists.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def spawn(name: str, argv: list[str], log_dir: Path, death_signal: int = signal.SIGKILL) -> Proc:
    """Start `argv` logging to <log_dir>/<name>.log. The default death signal is SIGKILL: an
    apiserver SIGTERMed after etcd is gone can hang in its graceful shutdown."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        log.write(f"\n=== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() signals its children too
            preexec_fn=functools.partial(_die_with_parent, death_signal),
        )
    return Proc(name, popen, log_path)


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(proc: Proc, grace: float) -> None:
    """SIGTERM the whole group, SIGKILL what is left after `grace` seconds."""
    kill_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(timeout=grace)
    # The group may outlive its leader (a pod's processes): kill the rest unconditionally.
    kill_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(timeout=5)


def kill_stale(pids_file: Path, marker: str, grace: float = 10.0) -> list[str]:
    """Kill what a dead supervisor left running: each pid in `pids_file` whose command line
    still contains `marker` (the state dir), so a reused pid is never touched."""
    try:
        pids: dict[str, int] = json.loads(pids_file.read_text())
    except (OSError, ValueError):
        return []
    killed = []
    for name, pid in reversed(list(pids.items())):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            kill_group(pid, signal.SIGTERM)
            _wait_gone(pid, grace)
            kill_group(pid, signal.SIGKILL)
            killed.append(name)
    pids_file.unlink(missing_ok=True)
    return killed


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
