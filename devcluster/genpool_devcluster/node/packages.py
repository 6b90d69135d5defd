"""The host packages a real node needs, installed once from Debian's archive with apt.

containerd 1.6, runc, the CNI plugins, iptables and conntrack (kube-proxy), buildah and
debootstrap (the images). Checked by the files they install, so an `up` on a ready machine
costs nothing; a machine without apt (or not root) gets a clear error naming the packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

# package -> a file it installs (gcc for the pause binary is on every machine here)
PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iproute2": "ip",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
}


def _present(marker: str) -> bool:
    return Path(marker).exists() if marker.startswith("/") else shutil.which(marker) is not None


def missing() -> list[str]:
    return [pkg for pkg, marker in PACKAGES.items() if not _present(marker)]


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env)


def ensure() -> None:
    """Install what is missing (apt-get; the package lists are refreshed only if the first
    try fails). RuntimeError with apt's own words when that is not possible."""
    need = missing()
    if not need:
        return
    started = time.monotonic()
    print(f"[devcluster node] apt-get install {' '.join(need)} ...", file=sys.stderr, flush=True)
    res = _apt("install", "-y", "--no-install-recommends", *need)
    if res.returncode != 0:
        _apt("update")
        res = _apt("install", "-y", "--no-install-recommends", *need)
    if res.returncode != 0 or missing():
        raise RuntimeError(
            f"the real node needs the Debian packages {', '.join(need)}; "
            f"apt-get install failed:\n{res.stderr[-2000:]}"
        )
    took = time.monotonic() - started
    print(f"[devcluster node] packages installed in {took:.0f} s", file=sys.stderr, flush=True)
