"""What the real node changes on this host, recorded at `up` and restored at `down`.

The kubelet writes a few kernel sysctls, the bridge plugin turns on IPv4 forwarding, and pods
leave cgroups, mounts and containerd shims behind if the node is stopped while they run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

# The sysctls the kubelet (setupKernelTunables), the bridge plugin and kube-proxy may write.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
)
PROC_SYS = Path("/proc/sys")
CGROUP_FS = Path("/sys/fs/cgroup")


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (PROC_SYS / name).read_text().strip()
    return values


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)


def kube_chains() -> list[str]:
    """KUBE-* chains of the filter table (`kube-proxy --cleanup` leaves KUBE-FIREWALL)."""
    out = _iptables("-S").stdout
    return [ln.split()[1] for ln in out.splitlines() if ln.startswith("-N KUBE-")]


def record(path: Path) -> None:
    """Save the host's values once: a node that crashed must not record its own changes."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"sysctls": read_sysctls(), "chains": kube_chains()}
        path.write_text(json.dumps(state, indent=2) + "\n")


def restore(path: Path) -> list[str]:
    """Write back every recorded sysctl that changed and drop the filter chains the node
    added; returns what it restored."""
    try:
        saved = json.loads(path.read_text())
        sysctls: dict[str, str] = saved["sysctls"]
        chains: list[str] = saved["chains"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    now = read_sysctls()
    changed = [name for name, value in sysctls.items() if now.get(name) != value]
    for name in changed:
        with contextlib.suppress(OSError):
            (PROC_SYS / name).write_text(sysctls[name] + "\n")
    added = [c for c in kube_chains() if c not in chains]
    rules = _iptables("-S").stdout.splitlines()
    for chain in added:
        # Each rule that jumps to it (`-A INPUT -j KUBE-FIREWALL`), deleted by its own spec.
        for rule in rules:
            if rule.startswith("-A ") and rule.split()[-2:] == ["-j", chain]:
                _iptables("-D", *rule.split()[1:])
        _iptables("-F", chain)
        _iptables("-X", chain)
    path.unlink()
    return changed + added


def cgroup_dirs(cgroup_root: str) -> list[Path]:
    """The cluster's cgroup root in every mounted v1 controller (and the unified tree)."""
    dirs = []
    for controller in sorted(CGROUP_FS.iterdir()):
        if controller.is_dir() and not controller.is_symlink():
            dirs.append(controller / cgroup_root.strip("/"))
    return dirs


def make_cgroup_root(cgroup_root: str) -> None:
    """The kubelet refuses a `cgroupRoot` that does not exist in every controller."""
    for d in cgroup_dirs(cgroup_root):
        with contextlib.suppress(OSError):
            d.mkdir(exist_ok=True)
            _inherit_cpuset(d)


def _inherit_cpuset(d: Path) -> None:
    """A new cpuset cgroup starts with no CPUs or memory nodes: copy the parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        f = d / name
        if f.exists() and not f.read_text().strip():
            f.write_text((d.parent / name).read_text())


def _tree_pids(cgroup_root: str) -> set[int]:
    tops = [top for top in cgroup_dirs(cgroup_root) if top.exists()]
    return {pid for top in tops for procs in top.rglob("cgroup.procs") for pid in _pids(procs)}


def kill_cgroup_tree(cgroup_root: str, timeout: float = 15.0) -> int:
    """SIGKILL every process under the cluster's cgroups, wait until they are gone (a
    cgroup with a dying process cannot be removed), then remove them deepest first."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while (pids := _tree_pids(cgroup_root)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.1)
    for top in cgroup_dirs(cgroup_root):
        if top.exists():
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=_depth, reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
    return len(killed)


def _pids(procs_file: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(x) for x in procs_file.read_text().split()]
    return []


def _depth(p: Path) -> int:
    return len(p.parts)


def unmount_under(root: Path) -> list[str]:
    """Unmount what pods left under `root` (volumes, rootfs overlays), deepest first."""
    prefix = str(root.resolve()) + "/"
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefix):
            mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    return mounts


def kill_matching(marker: str) -> list[int]:
    """SIGKILL processes whose command line names `marker` (containerd shims of this node)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                pids.append(int(proc.name))
    return pids
