"""Reconcile latency: ``kubectl apply`` of a GenPool -> all of its children exist.

Starts a throw-away devcluster (binaries from the cache; not built here, so a bench
run never triggers a 20-minute Go build) and the operator as a local process.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from genpool_core.names import (
    API_GROUP,
    API_KIND,
    API_PLURAL,
    API_VERSION,
    GROUP_VERSION,
    pool_label_selector,
)

CHILDREN = 6  # StatefulSet, 2 Services, ConfigMap, PDB, admin Secret
CRD = Path(__file__).resolve().parents[1] / "crds" / "genpool.dev_genpools.yaml"


def _count_children(api: Any, namespace: str, pool: str) -> int:
    from kubernetes import client

    selector = pool_label_selector(pool)
    core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    lists = (
        apps.list_namespaced_stateful_set(namespace, label_selector=selector),
        core.list_namespaced_service(namespace, label_selector=selector),
        core.list_namespaced_config_map(namespace, label_selector=selector),
        policy.list_namespaced_pod_disruption_budget(namespace, label_selector=selector),
        core.list_namespaced_secret(namespace, label_selector=selector),
    )
    return sum(len(found.items) for found in lists)


def _one(api: Any, namespace: str, name: str, timeout_s: float = 60.0) -> float:
    from kubernetes import client

    body = {
        "apiVersion": GROUP_VERSION,
        "kind": API_KIND,
        "metadata": {"name": name},
        "spec": {"replicas": 0, "model": "synthetic:tiny", "accelerator": "none"},
    }
    objs = client.CustomObjectsApi(api)
    start = time.perf_counter()
    objs.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, API_PLURAL, body)
    while time.perf_counter() - start < timeout_s:
        if _count_children(api, namespace, name) >= CHILDREN:
            return time.perf_counter() - start
        time.sleep(0.01)
    raise TimeoutError(f"children of {name} did not appear in {timeout_s}s")


def measure_reconcile(*, repeats: int) -> dict[str, Any]:
    from genpool_devcluster import build
    from genpool_devcluster.cluster import Cluster

    bin_dir = build.bin_dir()
    needed = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
    if not all((bin_dir / name).exists() for name in needed):
        return {"skipped": "control-plane binaries not built (make devcluster builds them)"}
    from kubernetes import config

    with tempfile.TemporaryDirectory() as state, Cluster(Path(state), bin_dir=bin_dir) as cluster:
        kubectl = [str(bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(CRD)], check=True)
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "crd/genpools.genpool.dev"],
            check=True,
        )
        subprocess.run([*kubectl, "create", "namespace", "bench"], check=True)
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "GENPOOL_ADMIN_TOKEN": "b"}
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "genpool_operator.main",
                "--namespace",
                "bench",
                "--liveness-port",
                "0",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            kubeconfig = str(cluster.kubeconfig)
            api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            _one(api, "bench", "warmup")  # the operator's first watch and login
            samples = [_one(api, "bench", f"pool-{i}") for i in range(repeats)]
        finally:
            operator.terminate()
            operator.wait(15)
    return {
        "repeats": repeats,
        "children": CHILDREN,
        "median_s": round(statistics.median(samples), 4),
        "max_s": round(max(samples), 4),
        "samples_s": [round(s, 4) for s in samples],
    }
