"""The Node object this runner plays kubelet for: registration, Lease heartbeats, Ready.

Capacity advertises `nvidia.com/gpu: 8` so GPU pools schedule; no GPU is attached by the runner,
the processes simply run on this machine (CPU unless it has a GPU of its own).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import platform
import threading
import uuid
from typing import Any

import httpx

from .kube import ApiError, Kube

log = logging.getLogger(__name__)
Obj = dict[str, Any]
LEASE_S = 40
RENEW_S = 10.0
STATUS_EVERY = 6  # node status refresh every STATUS_EVERY lease renewals (60 s)
KUBELET_VERSION = "v1.35.4"
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _now(micro: bool = False) -> str:
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return dt.datetime.now(dt.UTC).strftime(fmt)


class Node:
    def __init__(self, kube: Kube, name: str, alloc: dict[str, str], host_ip: str) -> None:
        self.kube, self.name, self.alloc, self.host_ip = kube, name, alloc, host_ip
        self.port = 0
        self.labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                platform.machine(), "amd64"
            ),
            "genpool.dev/podrunner": "true",
        }
        self.since = _now()

    def register(self, kubelet_port: int) -> None:
        self.port = kubelet_port
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels},
        }
        try:
            self.kube.post("/api/v1/nodes", body)
            log.info("registered node %s", self.name)
        except ApiError as err:
            if err.status != 409:
                raise
            self.kube.merge_patch(
                f"/api/v1/nodes/{self.name}", {"metadata": {"labels": self.labels}}
            )
        self.report(ready=True)
        self.renew_lease()

    def report(self, ready: bool) -> None:
        self.kube.merge_patch(f"/api/v1/nodes/{self.name}/status", {"status": self._status(ready)})
        if ready:
            self._drop_not_ready_taints()

    def _status(self, ready: bool) -> Obj:
        now = _now()
        capacity = {**self.alloc, "pods": "110", "nvidia.com/gpu": "8"}

        def cond(kind: str, status: str, reason: str, message: str) -> Obj:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": self.since,
            }

        return {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "pod runner"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "pod runner"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "pod runner"),
                cond(
                    "Ready",
                    "True" if ready else "False",
                    "KubeletReady" if ready else "PodRunnerStopped",
                    "genpool pod runner is posting ready status" if ready else "pod runner stopped",
                ),
            ],
            "addresses": [{"type": "InternalIP", "address": self.host_ip}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": self._info(),
        }

    def _info(self) -> Obj:
        uname = os.uname()
        machine_id = _read("/etc/machine-id") or uuid.uuid5(uuid.NAMESPACE_DNS, uname.nodename).hex
        arch = self.labels["kubernetes.io/arch"]
        return {
            "machineID": machine_id,
            "systemUUID": machine_id,
            "bootID": _read("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": uname.release,
            "osImage": f"{uname.sysname} (genpool pod runner)",
            "containerRuntimeVersion": "process://genpool-podrunner",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": arch,
        }

    def _drop_not_ready_taints(self) -> None:
        """Admission taints a new node not-ready; with no node-lifecycle controller, we lift it."""
        node = self.kube.get(f"/api/v1/nodes/{self.name}")
        taints = node.get("spec", {}).get("taints") or []
        keep = [t for t in taints if t.get("key") not in NOT_READY_TAINTS]
        if len(keep) != len(taints):
            self.kube.merge_patch(f"/api/v1/nodes/{self.name}", {"spec": {"taints": keep or None}})

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_S,
            "renewTime": _now(micro=True),
        }
        try:
            self.kube.merge_patch(path, {"spec": spec})
        except ApiError as err:
            if err.status != 404:
                raise
            node = self.kube.get(f"/api/v1/nodes/{self.name}")
            owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.name,
                "uid": node["metadata"]["uid"],
            }
            meta = {"name": self.name, "namespace": "kube-node-lease", "ownerReferences": [owner]}
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": meta,
                "spec": spec,
            }
            self.kube.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body)

    def heartbeat(self, stop: threading.Event) -> None:
        """Thread body: renew the Lease every 10 s, refresh status (and Ready) every minute."""
        beats = 0
        while not stop.wait(RENEW_S):
            beats += 1
            try:
                self.renew_lease()
                if beats % STATUS_EVERY == 0:
                    self.report(ready=True)
            except (ApiError, httpx.HTTPError) as err:
                log.warning("node heartbeat: %s", err)


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""
