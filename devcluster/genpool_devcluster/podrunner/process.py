"""One run of a container: a local process in its own process group, output to a CRI-style log.

Images are not pulled: `command + args` runs from this machine's environment, looked up on a
PATH that starts with the project's venv bin dir. Log lines are written as the kubelet writes
/var/log/pods files (`<RFC3339 time> <stream> <F|P> <text>`), so `kubectl logs` can offer
timestamps and sinceSeconds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)
PARTIAL_MAX = 16 * 1024  # emit a P(artial) entry rather than buffer an endless line


class StartError(Exception):
    """The command could not be started (reported as ContainerCannotRun)."""


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def api_time() -> str:
    """metav1.Time precision (seconds): what the apiserver stores, so diffs stay quiet."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_executable(name: str, path: str) -> str:
    if "/" in name:
        if os.path.isfile(name) and os.access(name, os.X_OK):
            return name
        raise StartError(f'exec: "{name}": no such file or not executable')
    found = shutil.which(name, path=path)
    if not found:
        raise StartError(f'exec: "{name}": executable file not found in $PATH')
    return found


class LogPump(threading.Thread):
    """Copies a process's stdout and stderr into one log file, line by line, timestamped."""

    def __init__(self, stdout: IO[bytes], stderr: IO[bytes], path: Path) -> None:
        super().__init__(daemon=True, name=f"logs:{path.parent.name}")
        self.files = {stdout.fileno(): stdout, stderr.fileno(): stderr}
        self.fds = {stdout.fileno(): "stdout", stderr.fileno(): "stderr"}
        self.path = path
        self.pending = dict.fromkeys(self.fds, b"")

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        for fd in self.fds:
            sel.register(fd, selectors.EVENT_READ)
        with open(self.path, "ab", buffering=0) as out:
            while sel.get_map():
                for key, _ in sel.select():
                    fd = int(key.fd)
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        sel.unregister(fd)
                        self.files[fd].close()
                    out.write(self._entries(fd, chunk, eof=not chunk))
        sel.close()

    def _entries(self, fd: int, chunk: bytes, eof: bool) -> bytes:
        data = self.pending[fd] + chunk
        *lines, rest = data.split(b"\n")
        entries = [(line, b"F") for line in lines]
        if eof and rest:
            entries.append((rest, b"F"))
            rest = b""
        elif len(rest) > PARTIAL_MAX:
            entries.append((rest, b"P"))
            rest = b""
        self.pending[fd] = rest
        stamp, stream = now_rfc3339().encode(), self.fds[fd].encode()
        return b"".join(b"%s %s %s %s\n" % (stamp, stream, tag, text) for text, tag in entries)


class Proc:
    """A started container process. `poll()` gives the Kubernetes exit code once it is gone."""

    def __init__(self, argv: list[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> None:
        exe = resolve_executable(argv[0], env.get("PATH", os.defpath))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.popen = subprocess.Popen(
                argv,
                executable=exe,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            raise StartError(f"exec: {argv[0]!r}: {err.strerror or err}") from err
        assert self.popen.stdout and self.popen.stderr
        self.pump = LogPump(self.popen.stdout, self.popen.stderr, log_path)
        self.pump.start()
        self.pid = self.popen.pid
        self.exe = exe
        self.started_at = api_time()
        self.finished_at = ""
        self.stopping = False

    def poll(self) -> int | None:
        rc = self.popen.poll()
        if rc is None:
            return None
        if not self.finished_at:
            self.finished_at = api_time()
            self.signal(signal.SIGKILL)  # stragglers in the group die with the container
        return 128 - rc if rc < 0 else rc

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop_async(self, grace_s: float, pre_stop: Callable[[float], None] | None = None) -> None:
        """preStop (bounded by the grace period), SIGTERM, then SIGKILL when the grace runs out."""
        if self.stopping:
            return
        self.stopping = True
        threading.Thread(
            target=self._stop, args=(grace_s, pre_stop), daemon=True, name=f"stop:{self.pid}"
        ).start()

    def _stop(self, grace_s: float, pre_stop: Callable[[float], None] | None) -> None:
        deadline = time.monotonic() + max(grace_s, 0.0)
        if pre_stop is not None and self.popen.poll() is None:
            try:
                pre_stop(max(deadline - time.monotonic(), 0.0))
            except Exception as err:  # a hook failing must not keep the container alive
                log.warning("preStop of pid %s failed: %s", self.pid, err)
        self.signal(signal.SIGTERM)
        # Like the kubelet: at least 2 s between SIGTERM and SIGKILL even when preStop used it all.
        deadline = max(deadline, time.monotonic() + min(2.0, grace_s))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(deadline - time.monotonic(), 0.0))
        self.signal(signal.SIGKILL)

    def kill_now(self) -> None:
        self.stopping = True
        self.signal(signal.SIGKILL)

    @property
    def log_open(self) -> bool:
        return self.pump.is_alive()


def exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"
