"""The detached process behind `genpool devcluster up`: owns a Cluster until SIGTERM.

Files in the state dir: `supervisor.pid` (this process), `ready` (written once the API serves),
`logs/supervisor.log`. The children die with it (PR_SET_PDEATHSIG), so a SIGKILLed supervisor
leaves no control plane behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import kubeconfig, procs
from .cluster import RUNTIMES, Cluster
from .node.runtime import node_leftovers

PID_FILE = "supervisor.pid"
READY_FILE = "ready"
MAX_PODRUNNER_RESTARTS = 5
MODULE = "genpool_devcluster.supervisor"  # not __name__: that is "__main__" when run


def pid_path(state_dir: Path) -> Path:
    return state_dir / PID_FILE


def running_pid(state_dir: Path) -> int | None:
    """The supervisor's pid if it is alive; a stale pid file (dead or reused pid) is removed."""
    path = pid_path(state_dir)
    try:
        pid = int(path.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return None
    if MODULE.encode() not in cmdline:
        path.unlink(missing_ok=True)  # the pid now belongs to something else
        return None
    return pid


def spawn(
    state_dir: Path, runtime: str, timeout: float, images: Sequence[Path] = ()
) -> subprocess.Popen[bytes]:
    log_dir = state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / READY_FILE).unlink(missing_ok=True)
    argv = [sys.executable, "-m", MODULE, "--state-dir", str(state_dir), "--timeout", str(timeout),
            "--runtime", runtime]  # fmt: skip
    for archive in images:
        argv += ["--image", str(archive)]
    with open(log_dir / "supervisor.log", "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the CLI and its terminal
        )  # fmt: skip


def wait_ready(state_dir: Path, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (state_dir / READY_FILE).exists():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.25)
    return False


def wait_serving(state_dir: Path, timeout: float) -> bool:
    """For a supervisor that already runs: True once its API answers /readyz."""
    deadline = time.monotonic() + timeout
    while running_pid(state_dir) is not None and time.monotonic() < deadline:
        kc = state_dir / "kubeconfig"
        if (state_dir / READY_FILE).exists() and kc.exists():
            return kubeconfig.Api.from_kubeconfig(kc).ready()
        time.sleep(0.25)
    return False


def _alive(pid: int) -> bool:
    """Running, not a zombie (the CLI that spawned a supervisor may not have reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_leftovers(state_dir: Path) -> list[str]:
    """Components a SIGKILLed supervisor left behind (PR_SET_PDEATHSIG makes this rare),
    and a real node's pods, mounts, bridge and host settings."""
    left = procs.kill_stale(state_dir / "pids.json", str(state_dir))
    return left + node_leftovers(state_dir)


def stop(state_dir: Path, timeout: float = 60.0) -> bool:
    """SIGTERM the supervisor and wait; SIGKILL its group if it hangs. False if none ran."""
    pid = running_pid(state_dir)
    if pid is None:
        return bool(kill_leftovers(state_dir))
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        procs.kill_group(pid, signal.SIGKILL)
        kill_leftovers(state_dir)
    pid_path(state_dir).unlink(missing_ok=True)
    (state_dir / READY_FILE).unlink(missing_ok=True)
    return True


def _watch(cluster: Cluster, stopping: Callable[[], bool]) -> int:
    restarts = 0
    while not stopping():
        dead = cluster.dead()
        if dead and dead.name == "podrunner" and restarts < MAX_PODRUNNER_RESTARTS:
            restarts += 1
            print(f"podrunner exited ({dead.popen.returncode}): restart {restarts}", flush=True)
            time.sleep(1)
            cluster.restart(dead)
        elif dead:
            print(f"{dead.name} exited ({dead.popen.returncode}): stopping", flush=True)
            return 1
        time.sleep(1)
    return 0


def supervise(state_dir: Path, runtime: str, timeout: float, images: Sequence[Path] = ()) -> int:
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    other = running_pid(state_dir)
    if other is not None and other != os.getpid():
        print(f"another supervisor ({other}) owns {state_dir}", flush=True)
        return 1
    left = kill_leftovers(state_dir)
    if left:
        print(f"killed leftovers of an earlier run: {', '.join(left)}", flush=True)
    pid_path(state_dir).write_text(f"{os.getpid()}\n")
    cluster = Cluster(state_dir, runtime=runtime, images=images)
    try:
        cluster.start(timeout=timeout)
        (state_dir / READY_FILE).write_text(cluster.server + "\n")
        print(f"cluster up at {cluster.server}", flush=True)
        return _watch(cluster, lambda: stopping)
    finally:
        cluster.stop()
        (state_dir / READY_FILE).unlink(missing_ok=True)
        pid_path(state_dir).unlink(missing_ok=True)
        print("cluster stopped", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description="internal: run by `genpool devcluster up`")
    p.add_argument("--state-dir", type=Path, required=True, help="the cluster's state directory")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to become ready (default: 300)"
    )
    p.add_argument("--runtime", choices=RUNTIMES, default="node", help="what runs pods")
    p.add_argument("--image", type=Path, action="append", default=[],
                   help="an image archive the node imports (repeatable)")  # fmt: skip
    args = p.parse_args()
    args.state_dir.mkdir(parents=True, exist_ok=True)
    return supervise(args.state_dir, args.runtime, args.timeout, args.image)


if __name__ == "__main__":
    sys.exit(main())
