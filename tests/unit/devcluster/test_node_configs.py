"""The real node's pure parts: configuration builders, the pod network's choice, and the
pause image archive (docs/devcluster.md#the-real-node)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from genpool_devcluster.node import configs, host, network, packages, pause

LAYOUT = configs.NodeLayout(Path("/state/node"))


def test_containerd_config_is_toml_with_the_settings_this_machine_needs() -> None:
    doc = tomllib.loads(configs.containerd_config(LAYOUT))
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert doc["root"] == "/state/node/containerd/root"
    assert doc["grpc"]["address"] == "/state/node/containerd/containerd.sock"
    assert cri["restrict_oom_score_adj"] is True  # runc fails every pod without it here
    assert cri["sandbox_image"] == configs.PAUSE_IMAGE
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"] == "/state/node/cni/net.d"


def test_cni_never_masquerades_off_the_machine() -> None:
    conf = configs.cni_conflist("gpabc", "10.244.7.0/24", "10.244.7.1", Path("/ipam"))
    bridge = conf["plugins"][0]
    assert bridge["bridge"] == "gpabc" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.7.0/24", "gateway": "10.244.7.1"}]]
    assert conf["plugins"][1]["snat"] is False


def test_kubelet_config_uses_absolute_eviction_floors_and_cgroupfs() -> None:
    conf = configs.kubelet_config(
        LAYOUT, "10.244.7.1", (4000, 4001), Path("/pki/ca.crt"), "/genpool-gpabc"
    )
    assert (conf["port"], conf["healthzPort"], conf["cgroupRoot"]) == (4000, 4001, "/genpool-gpabc")
    assert conf["failCgroupV1"] is False and conf["cgroupDriver"] == "cgroupfs"
    assert conf["imageGCHighThresholdPercent"] == 100
    assert all(not v.endswith("%") for v in conf["evictionHard"].values())
    assert conf["authentication"]["anonymous"]["enabled"] is False
    assert conf["containerRuntimeEndpoint"] == f"unix://{LAYOUT.containerd_socket}"


def test_kube_proxy_leaves_conntrack_alone_and_node_ports_on_the_bridge() -> None:
    conf = configs.kube_proxy_config(
        Path("/kc"), "node", "10.244.7.1", "10.244.7.0/24", (4002, 4003)
    )
    assert conf["conntrack"]["maxPerCore"] == 0 and conf["conntrack"]["min"] == 0
    assert conf["nodePortAddresses"] == ["10.244.7.0/24"]
    assert conf["iptables"]["localhostNodePorts"] is False


def test_the_network_is_stable_per_state_dir_and_skips_routed_subnets() -> None:
    first = network.choose(Path("/a"), set())
    assert network.choose(Path("/a"), set()) == first
    assert network.choose(Path("/b"), set()).bridge != first.bridge
    assert len(first.bridge) <= 15  # Linux interface names
    other = network.choose(Path("/a"), {first.subnet})
    assert other.subnet != first.subnet and other.bridge == first.bridge
    assert first.gateway.endswith(".1") and first.gateway.startswith("10.244.")


def test_every_subnet_taken_is_a_clear_error() -> None:
    every = {str(s) for s in network.SUPERNET.subnets(new_prefix=24)}
    with pytest.raises(RuntimeError, match="every /24"):
        network.choose(Path("/a"), every)


def test_pause_archive_is_an_oci_layout_whose_digests_match() -> None:
    data = pause.oci_archive(b"\x7fELF-not-really")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == configs.PAUSE_IMAGE
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'][7:]}"])
    layer = gzip.decompress(files[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"])
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        member = tar.getmember("pause")
        assert member.mode == 0o755
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]


def test_down_restores_the_sysctls_and_chains_up_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc_sys = tmp_path / "sys"
    for name, value in {"net/ipv4/ip_forward": "0", "vm/overcommit_memory": "0"}.items():
        (proc_sys / name).parent.mkdir(parents=True, exist_ok=True)
        (proc_sys / name).write_text(value + "\n")
    monkeypatch.setattr(host, "PROC_SYS", proc_sys)
    chains = ["KUBE-KEPT"]
    monkeypatch.setattr(host, "kube_chains", lambda: list(chains))
    dropped: list[tuple[str, ...]] = []
    monkeypatch.setattr(host, "_iptables", lambda *a: dropped.append(a) or _rules())
    record = tmp_path / "host.json"
    host.record(record)
    (proc_sys / "net/ipv4/ip_forward").write_text("1\n")  # what the bridge plugin does
    chains.append("KUBE-FIREWALL")  # what the kubelet leaves
    host.record(record)  # a second `up` must not record the node's own changes
    assert host.restore(record) == ["net/ipv4/ip_forward", "KUBE-FIREWALL"]
    assert (proc_sys / "net/ipv4/ip_forward").read_text() == "0\n"
    assert ("-X", "KUBE-FIREWALL") in dropped and not any("KUBE-KEPT" in a for a in dropped)
    assert ("-D", "INPUT", "-j", "KUBE-FIREWALL") in dropped
    assert ("-D", "OUTPUT", "-j", "KUBE-FIREWALL") in dropped
    assert not record.exists() and host.restore(record) == []


def _rules() -> subprocess.CompletedProcess[str]:
    """`iptables -S` as the host shows it: jumps to a chain the node added and to one it kept."""
    rules = "-A INPUT -j KUBE-FIREWALL\n-A OUTPUT -j KUBE-FIREWALL\n-A FORWARD -j KUBE-KEPT\n"
    return subprocess.CompletedProcess([], 0, rules, "")


def test_missing_packages_are_named_by_the_files_they_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(packages.shutil, "which", lambda name: None if name == "runc" else name)
    monkeypatch.setattr(packages.Path, "exists", lambda self: False)
    assert packages.missing() == ["runc", "containernetworking-plugins"]


def test_a_runtime_from_the_environment_is_checked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from genpool_devcluster import cli

    monkeypatch.setenv(cli.RUNTIME_ENV, "kind")
    with pytest.raises(SystemExit) as exc:
        cli.main(["up", "--state-dir", "/nonexistent/state"])
    assert exc.value.code == 2
    assert "GENPOOL_DEVCLUSTER_RUNTIME=kind: expected one of node, podrunner, none" in (
        capsys.readouterr().err
    )
