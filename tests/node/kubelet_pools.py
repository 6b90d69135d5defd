"""The pools of tests/node/test_kubelet_runs_workers.py, started at the beginning of the
node tier's session (the `pools` fixture in conftest.py): their starts, back-offs and the
liveness probe's minute overlap with the helm e2e instead of adding up."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tests.integration.operator_harness import create_pool, genpool, ready_pods, synthetic_spec
from tests.node_cluster import pod_process
from tests.polling import wait_for

MISSING_MODEL = "no-such-model.gguf"
# SmolLM2's fp32 weights alone are ~540 MB: loading them breaks a 300Mi limit.
POOLS: dict[str, dict[str, Any]] = {
    "secure": synthetic_spec(),
    "probed": synthetic_spec(),
    "small": synthetic_spec(
        model="smollm2-135m",
        resources={"limits": {"memory": "300Mi"}},
        engine={"maxBatchSize": 8, "kvCacheMemory": "16Mi"},
    ),
    "broken": synthetic_spec(model=MISSING_MODEL),
    # More CPU than the node has: the scheduler places none.
    "unplaceable": synthetic_spec(resources={"requests": {"cpu": "64"}}),
}


@dataclass(frozen=True)
class NodePools:
    namespaces: dict[str, str]  # pool name -> its own namespace
    hung: Future[client.V1Pod]  # the "probed" pod, once stopped and no longer Ready


def ready_pod(api: client.ApiClient, namespace: str, pool: str) -> client.V1Pod:
    pods: list[client.V1Pod] = wait_for(
        lambda: ready_pods(api, namespace, pool), f"{pool}: a ready worker pod", timeout=240
    )
    return pods[0]


def hang_worker(api: client.ApiClient, namespace: str) -> client.V1Pod:
    """A hung worker: once Ready, its process is stopped (SIGSTOP from this host), so it
    answers no probe; returns the pod once the kubelet's readiness probe has failed."""
    pod = ready_pod(api, namespace, "probed")
    os.kill(pod_process(pod.metadata.uid, "genpool-worker"), signal.SIGSTOP)
    wait_for(lambda: not ready_pods(api, namespace, "probed"), "readiness fails", 30)
    return pod


@contextmanager
def node_pools(api: client.ApiClient) -> Iterator[NodePools]:
    core = client.CoreV1Api(api)
    namespaces = {name: f"node-{name}-{uuid.uuid4().hex[:6]}" for name in POOLS}
    for name, ns in namespaces.items():
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        create_pool(api, ns, genpool(name, POOLS[name]))
    with ThreadPoolExecutor(max_workers=1) as pool:
        hung = pool.submit(hang_worker, api, namespaces["probed"])
        try:
            yield NodePools(namespaces, hung)
        finally:
            for ns in namespaces.values():
                core.delete_namespace(ns)
