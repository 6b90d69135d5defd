"""The cluster's pod network on this host: one bridge and one /24 per cluster.

The bridge exists before the apiserver starts, because the apiserver binds its address (pods
reach the API there through the `kubernetes` Service). The CNI bridge plugin finds it and
attaches pods. Nothing is routed or masqueraded off the machine: the subnet is private and
the conflist sets no `ipMasq`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

SUPERNET = ipaddress.ip_network("10.244.0.0/16")


@dataclass(frozen=True)
class PodNetwork:
    bridge: str
    subnet: str  # e.g. 10.244.37.0/24

    @property
    def gateway(self) -> str:
        """The bridge's own address: the node IP the apiserver and kubelet bind."""
        return str(next(ipaddress.ip_network(self.subnet).hosts()))


def _digest(state_dir: Path) -> str:
    return hashlib.sha256(str(state_dir).encode()).hexdigest()


def choose(state_dir: Path, taken: set[str]) -> PodNetwork:
    """A bridge name and /24 derived from the state dir, skipping subnets already routed."""
    digest = _digest(state_dir)
    subnets = list(SUPERNET.subnets(new_prefix=24))
    start = int(digest[:8], 16) % len(subnets)
    for i in range(len(subnets)):
        subnet = str(subnets[(start + i) % len(subnets)])
        if subnet not in taken:
            return PodNetwork(bridge=f"gp{digest[:8]}", subnet=subnet)
    raise RuntimeError(f"every /24 of {SUPERNET} is routed already")


def routed_subnets() -> set[str]:
    out = subprocess.run(["ip", "-j", "route"], capture_output=True, text=True, check=True)
    return {str(r["dst"]) for r in json.loads(out.stdout or "[]") if "/" in str(r.get("dst"))}


def _load(path: Path) -> PodNetwork | None:
    try:
        return PodNetwork(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def load_or_choose(path: Path, state_dir: Path) -> PodNetwork:
    """The network this state dir used before (its kubeconfig names the gateway), else new."""
    found = _load(path)
    if found is not None:
        return found
    net = choose(state_dir, routed_subnets())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(net)) + "\n")
    return net


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def create_bridge(net: PodNetwork) -> None:
    """The bridge with the gateway address, up. Idempotent."""
    if _ip("link", "show", net.bridge).returncode != 0:
        res = _ip("link", "add", net.bridge, "type", "bridge")
        if res.returncode != 0:
            raise RuntimeError(f"ip link add {net.bridge}: {res.stderr.strip()}")
    prefix = ipaddress.ip_network(net.subnet).prefixlen
    res = _ip("addr", "replace", f"{net.gateway}/{prefix}", "dev", net.bridge)
    if res.returncode != 0:
        raise RuntimeError(f"ip addr replace on {net.bridge}: {res.stderr.strip()}")
    _ip("link", "set", net.bridge, "up")


def delete_bridge(net: PodNetwork) -> None:
    _ip("link", "delete", net.bridge)
