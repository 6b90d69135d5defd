"""Pure builders for the real node's configuration files: each returns text or a dict.

Every setting here was needed on the project's machines (2 cores, cgroup v1, root without
CAP_SYS_RESOURCE, a disk that reports far more capacity than is free); the comments say why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
PAUSE_IMAGE = "localhost/genpool/pause:1"
CNI_NETWORK = "genpool"


@dataclass(frozen=True)
class NodeLayout:
    """Where one cluster's node keeps its state (all under the cluster's state dir)."""

    root: Path  # <state>/node

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_state_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.kubelet_dir / "config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.kubelet_dir / "kubeconfig"

    @property
    def proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"

    @property
    def host_state(self) -> Path:
        """What `up` changed on the host, for `down` to restore."""
        return self.root / "host.json"


def _toml(value: object) -> str:
    return json.dumps(value)  # TOML basic strings, booleans and ints read as JSON does


def containerd_config(layout: NodeLayout) -> str:
    """containerd 1.6 (config version 2) with a private root, state and socket."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f"root = {_toml(str(layout.containerd_root))}",
            f"state = {_toml(str(layout.containerd_state))}",
            # Only the CRI needs these; the others fail on this machine and only log noise.
            'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs",'
            ' "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",'
            ' "io.containerd.snapshotter.v1.aufs"]',
            "[grpc]",
            f"  address = {_toml(str(layout.containerd_socket))}",
            f"[{cri}]",
            # A local pause image, pinned: nothing can be pulled here.
            f"  sandbox_image = {_toml(PAUSE_IMAGE)}",
            # Without it runc fails every container: no CAP_SYS_RESOURCE to lower the
            # OOM score adjustment below the parent's.
            "  restrict_oom_score_adj = true",
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",  # the kubelet's cgroupfs driver
            f"[{cri}.cni]",
            f"  bin_dir = {_toml(CNI_BIN_DIR)}",
            f"  conf_dir = {_toml(str(layout.cni_conf_dir))}",
            "  max_conf_num = 1",
            "",
        ]
    )


def cni_conflist(bridge: str, subnet: str, gateway: str, ipam_dir: Path) -> dict[str, Any]:
    """A bridge with host-local addresses: pods reach each other and this host, nothing else.

    No `ipMasq`: pod traffic is never masqueraded off the machine; no default route beyond
    the bridge's subnet and the Service range (reached through kube-proxy on this host)."""
    return {
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
        ],
    }


def kubelet_config(
    layout: NodeLayout, node_ip: str, ports: tuple[int, int], ca_file: Path, cgroup_root: str
) -> dict[str, Any]:
    """KubeletConfiguration (written as JSON, which YAML readers accept). `ports`: the
    kubelet's API and healthz ports; `cgroup_root`: the cluster's own, so `down` finds every
    pod process there."""
    port, healthz_port = ports
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        # cgroup v1 hybrid hosts: the kubelet refuses them by default since 1.35.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        # The disk reports far more capacity than is free: percentages made the kubelet
        # garbage-collect and evict every image. Absolute floors only.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "256Mi",
            "nodefs.available": "2Gi",
            "imagefs.available": "2Gi",
        },
        # kube-proxy owns the NAT rules; the kubelet must not add its own chains.
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(layout.kubelet_dir / "pod-logs"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        # Only the apiserver (its kubelet-client cert, signed by the cluster CA) gets in.
        "authorization": {"mode": "AlwaysAllow"},
        "resolvConf": "",  # no cluster DNS; pods address each other by IP
        "serializeImagePulls": False,
        "maxPods": 110,
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "containerLogMaxSize": "10Mi",
    }


def kube_proxy_config(
    kubeconfig: Path, node_name: str, node_ip: str, pod_cidr: str, ports: tuple[int, int]
) -> dict[str, Any]:
    """KubeProxyConfiguration in iptables mode that leaves the host's sysctls alone."""
    healthz, metrics = ports
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "mode": "iptables",
        "clusterCIDR": pod_cidr,
        "bindAddress": node_ip,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        # Zero: keep the host's conntrack table size and timeouts (no sysctl writes).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        # NodePorts answer on the pod bridge only, never on the machine's own interfaces.
        "nodePortAddresses": [pod_cidr],
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        "detectLocalMode": "ClusterCIDR",
    }
