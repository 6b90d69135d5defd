"""One real node for one cluster: its files, its processes' command lines, its teardown.

`Cluster` (../cluster.py) starts the processes in order once the apiserver serves on the
node's bridge address: kube-scheduler, containerd (then the image imports), kube-proxy and
the kubelet.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from .. import build, certs, images
from ..kubeconfig import Watchdog, render, write_file
from . import configs, host, image_import, network, packages, pause

CTR = "ctr"
NODE_NAME = "genpool-dev"
CONTAINERD = "containerd"


class Node:
    """The node's layout, network and cgroup root are fixed by the state dir."""

    def __init__(self, state_dir: Path, bin_dir: Path, pki: certs.Pki, name: str) -> None:
        self.layout = configs.NodeLayout(state_dir / "node")
        self.bin_dir, self.pki, self.name = bin_dir, pki, name
        self.net = network.load_or_choose(self.layout.root / "network.json", state_dir)
        # Pods' cgroups live under a root of their own, so `down` finds and removes them.
        self.cgroup_root = f"/genpool-{self.net.bridge}"

    @property
    def ip(self) -> str:
        return self.net.gateway

    def serving_cert(self) -> tuple[Path, Path]:
        return certs.ensure_node_certs(self.pki, self.name, self.ip)

    def prepare(self, server: str, admin_kubeconfig: Path, ports: dict[str, int]) -> None:
        """Record the host's state, make the bridge and cgroup root, write every config."""
        lay = self.layout
        host.record(lay.host_state)
        network.create_bridge(self.net)
        host.make_cgroup_root(self.cgroup_root)
        write_file(lay.containerd_config, configs.containerd_config(lay), 0o644)
        conflist = configs.cni_conflist(
            self.net.bridge, self.net.subnet, self.net.gateway, lay.cni_state_dir
        )
        write_file(lay.cni_conf_dir / "10-genpool.conflist", json.dumps(conflist, indent=2), 0o644)
        kubelet = configs.kubelet_config(
            lay, self.ip, (ports["kubelet"], ports["kubelet_healthz"]), self.pki.ca_crt,
            self.cgroup_root,
        )  # fmt: skip
        write_file(lay.kubelet_config, json.dumps(kubelet, indent=2), 0o644)
        kubelet_user = {"client-certificate": str(self.pki.kubelet_crt),
                        "client-key": str(self.pki.kubelet_key)}  # fmt: skip
        write_file(lay.kubelet_kubeconfig,
                   render(server, self.pki.ca_crt, "kubelet", kubelet_user))  # fmt: skip
        proxy = configs.kube_proxy_config(
            admin_kubeconfig, self.name, self.ip, self.net.subnet,
            (ports["proxy_healthz"], ports["proxy_metrics"]),
        )  # fmt: skip
        write_file(lay.proxy_config, json.dumps(proxy, indent=2), 0o644)

    # ---- command lines -----------------------------------------------------------------

    def containerd_argv(self) -> list[str]:
        return [CONTAINERD, "--config", str(self.layout.containerd_config), "--log-level=warn"]

    def kubelet_argv(self) -> list[str]:
        lay = self.layout
        return [
            str(self.bin_dir / "kubelet"),
            f"--config={lay.kubelet_config}",
            f"--kubeconfig={lay.kubelet_kubeconfig}",
            f"--root-dir={lay.kubelet_dir / 'root'}",
            f"--cert-dir={lay.kubelet_dir / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            "--v=1",
        ]

    def scheduler_argv(self, kubeconfig: Path, port: int) -> list[str]:
        return [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
        ]

    def proxy_argv(self) -> list[str]:
        return [str(self.bin_dir / "kube-proxy"), f"--config={self.layout.proxy_config}"]

    # ---- images ------------------------------------------------------------------------

    def wait_containerd(self, check: Watchdog) -> None:
        while self._ctr("version").returncode != 0:
            check()
            time.sleep(0.2)

    def _ctr_argv(self) -> list[str]:
        return [CTR, "-a", str(self.layout.containerd_socket), "-n", "k8s.io"]

    def _ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._ctr_argv(), *args], capture_output=True, text=True)

    def import_image(self, archive: Path, *, whole: bool = False) -> bool:
        """Import an image archive once (containerd keeps it across restarts of this node):
        a docker-archive (``images.ensure_image``) with only the layers containerd lacks
        (``image_import``), or, ``whole``, as it is; False when it was imported before."""
        marker = _import_marker(self.layout, archive)
        if marker.exists():
            return False
        if not whole:
            image_import.import_archive(self._ctr_argv(), archive)
        elif (res := self._ctr("images", "import", str(archive))).returncode != 0:
            raise RuntimeError(f"ctr images import {archive}: {res.stderr.strip()[-2000:]}")
        write_file(marker, time.strftime("%F %T\n"), 0o644)
        return True

    def import_pause(self, cache: Path) -> None:
        """The pause image: an OCI archive of a few KB, imported as it is."""
        self.import_image(pause.ensure_archive(cache), whole=True)

    # ---- teardown ----------------------------------------------------------------------

    def teardown(self) -> list[str]:
        """After the node's processes stopped: kill what pods left, unmount, drop NAT rules,
        the bridge and the cgroup root, restore the sysctls. Returns what it cleaned."""
        done = []
        if host.kill_cgroup_tree(self.cgroup_root):
            done.append("pod processes")
        if host.kill_matching(str(self.layout.containerd_socket)):
            done.append("containerd shims")
        if host.unmount_under(self.layout.root):
            done.append("pod mounts")
        subprocess.run([str(self.bin_dir / "kube-proxy"), "--cleanup",
                        f"--config={self.layout.proxy_config}"], capture_output=True)  # fmt: skip
        network.delete_bridge(self.net)
        restored = host.restore(self.layout.host_state)
        if restored:
            done.append("sysctls " + ", ".join(restored))
        return done


def node_leftovers(state_dir: Path) -> list[str]:
    """Tear down a node whose cluster died without doing it (its host record is still
    there: `teardown` removes it last)."""
    layout = configs.NodeLayout(state_dir / "node")
    if not layout.host_state.exists():
        return []
    node = Node(state_dir, build.bin_dir(), certs.Pki(state_dir / "pki"), NODE_NAME)
    return node.teardown()


def _import_marker(layout: configs.NodeLayout, archive: Path) -> Path:
    return layout.root / "imported" / archive.name


def pending_imports(state_dir: Path, archives: list[Path]) -> list[Path]:
    """The archives this state dir's node has not imported yet (for a progress line)."""
    layout = configs.NodeLayout(state_dir / "node")
    return [a for a in archives if not _import_marker(layout, a).exists()]


def ensure_host(repo_root: Path) -> list[Path]:
    """Everything a real node needs on this host: the Debian packages, kubelet,
    kube-scheduler and kube-proxy, and the images built from `repo_root`'s Dockerfiles
    (minutes the first time, then cached by content); returns the image archives."""
    packages.ensure()
    build.ensure_node_binaries()
    return images.ensure_images(repo_root)
