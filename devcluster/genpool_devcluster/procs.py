"""Child processes of the control plane: start in their own process group, stop without orphans."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """If the supervisor is SIGKILLed, the kernel sends SIGTERM to each child: no orphans."""
    # Not Linux (no prctl): `down` still kills by process group.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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


def spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Proc:
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
            env=env,
            start_new_session=True,  # own process group: stop() signals its children too
            preexec_fn=_die_with_parent,
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
