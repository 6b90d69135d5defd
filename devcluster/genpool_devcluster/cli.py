"""`genpool devcluster build|up|down|status|env`: a local control plane without Docker."""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import sys
from pathlib import Path

from . import build, checkout, kubeconfig, supervisor
from .cluster import RUNTIMES
from .node.runtime import ensure_host, pending_imports

DEFAULT_STATE_DIR = "~/.cache/genpool/devcluster/run"
RUNTIME_ENV = "GENPOOL_DEVCLUSTER_RUNTIME"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="genpool devcluster",
        description="etcd + kube-apiserver + kube-controller-manager + pod runner on loopback",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bp = sub.add_parser(
        "build", help="build or fetch the binaries (tens of minutes the first time)"
    )
    bp.add_argument(
        "--node",
        action="store_true",
        help="also the real node: its host packages (apt), kubelet, kube-scheduler, kube-proxy, "
        "and the worker and operator images",
    )
    for name, text in [
        ("up", "start the cluster in the background (no-op when already up)"),
        ("down", "stop the cluster (its data and PKI stay in the state dir)"),
        ("status", "say whether the cluster is up and serving (exit 0) or not (exit 1)"),
        ("env", "print shell exports for KUBECONFIG and PATH (kubectl, helm)"),
    ]:
        sp = sub.add_parser(name, help=text)
        sp.add_argument(
            "--state-dir",
            default=DEFAULT_STATE_DIR,
            help="directory of the cluster's data, PKI and logs (default: %(default)s)",
        )
        if name == "up":
            sp.add_argument(
                "--timeout",
                type=float,
                default=300.0,
                help="seconds to become ready (default: %(default)s)",
            )
            sp.add_argument(
                "--runtime",
                choices=RUNTIMES,
                default=os.environ.get(RUNTIME_ENV, "node"),
                help="what runs pods: a real node (containerd + kubelet, images built from the "
                "shipped Dockerfiles), the pod runner (local processes), or none "
                f"(pods stay Pending); default: %(default)s (${RUNTIME_ENV} sets it)",
            )
    return p


def _state_dir(p: argparse.ArgumentParser, raw: str) -> Path:
    path = Path(raw).expanduser().resolve()
    if path.exists() and not path.is_dir():
        p.error(f"--state-dir {raw}: exists and is not a directory")
    return path


def _up(state_dir: Path, timeout: float, runtime: str) -> int:
    # One `up` at a time per state dir: a second one waits, then finds the cluster up.
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _up_locked(state_dir, timeout, runtime)


def _up_locked(state_dir: Path, timeout: float, runtime: str) -> int:
    if supervisor.running_pid(state_dir) is not None:
        kc = state_dir / "kubeconfig"
        if supervisor.wait_serving(state_dir, timeout):
            print(f"already up: KUBECONFIG={kc}")
            return 0
        print("a supervisor runs but the API does not answer: restarting", file=sys.stderr)
        supervisor.stop(state_dir)
    archives: list[Path] = []
    if runtime == "node":
        archives = ensure_host(checkout.ROOT)
        pending = pending_imports(state_dir, archives)
        if pending:
            names = ", ".join(a.name for a in pending)
            print(
                f"[devcluster node] importing {names} into the node's containerd (the "
                "worker image: about a minute the first time per state dir, then seconds: "
                "only the layers it lacks)",
                file=sys.stderr,
            )
    else:
        build.ensure_binaries()
    proc = supervisor.spawn(state_dir, runtime, timeout, archives)
    if not supervisor.wait_ready(state_dir, proc, timeout + 30):
        supervisor.stop(state_dir)
        log = state_dir / "logs" / "supervisor.log"
        print(f"cluster did not come up; see {log} and {state_dir / 'logs'}/", file=sys.stderr)
        print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
        return 1
    print(f"up: KUBECONFIG={state_dir / 'kubeconfig'}")
    return 0


def _status(state_dir: Path) -> int:
    pid = supervisor.running_pid(state_dir)
    kc = state_dir / "kubeconfig"
    if pid is None or not kc.exists():
        print("down")
        return 1
    api = kubeconfig.Api.from_kubeconfig(kc)
    ready = api.ready()
    print(f"{'up' if ready else 'not ready'}: supervisor pid {pid}, {api.server}, KUBECONFIG={kc}")
    return 0 if ready else 1


def _env(state_dir: Path) -> int:
    kc = shlex.quote(str(state_dir / "kubeconfig"))
    print(f"export KUBECONFIG={kc} PATH={shlex.quote(str(build.bin_dir()))}:$PATH")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.command == "build":
        archives = ensure_host(checkout.ROOT) if args.node else []
        print("\n".join(map(str, [build.ensure_binaries(), *archives])))
        return 0
    state_dir = _state_dir(p, args.state_dir)
    if args.command == "up" and args.timeout <= 0:
        p.error("--timeout must be > 0")
    if args.command == "up" and args.runtime not in RUNTIMES:  # a default from the env
        p.error(f"${RUNTIME_ENV}={args.runtime}: expected one of {', '.join(RUNTIMES)}")
    if args.command == "up":
        return _up(state_dir, args.timeout, args.runtime)
    if args.command == "down":
        print("stopped" if supervisor.stop(state_dir) else "not running")
        return 0
    if args.command == "status":
        return _status(state_dir)
    return _env(state_dir)
