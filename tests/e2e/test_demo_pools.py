"""The demo's two pools and its load driver on the local control plane, in a minute.

``make demo`` itself runs for minutes; this runs its pool specs (``demo_pools.pool_specs``: the
same SLO and bounds, ``genpool`` pausing, ``replicas-only`` not) under the operator with a
short burst of the demo's open-loop load (both classes, no private field), and checks what
the demo's summary stands on: every request served, the samples (ready pods, paused
residents) and the replica-seconds of both pools, pauses in the pausing pool only, and each
operator-built pool reporting its measured TTFT from that traffic.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx
from kubernetes import client

from genpool_core.names import WORKER_PORT
from genpool_devcluster import demo_pools
from genpool_devcluster.demo_load import Phase, plan_arrivals, run_phased_load
from tests.conftest import DevCluster
from tests.integration.operator_harness import (
    create_pool,
    genpool,
    get_pool,
    ready_pods,
)
from tests.node_cluster import ChartOperator
from tests.polling import wait_for

# One synthetic replica serves about 4 req/s of the demo's mix: the burst overloads it.
PHASES = (Phase("quiet", 10, 2.0), Phase("burst", 20, 8.0), Phase("after", 10, 1.0))


def _spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The demo's pool with stats rounds and drains short enough for a test."""
    return spec | {"tuning": {"intervalSeconds": 3, "cooldownIntervals": 1},
                   "drain": {"timeoutSeconds": 10}}  # fmt: skip


def _pauses_total(api: client.ApiClient, namespace: str, name: str) -> int:
    """Pauses so far over the pool's ready workers (their ``/stats`` counters)."""
    urls = [
        f"http://{p.status.pod_ip}:{WORKER_PORT}/stats" for p in ready_pods(api, namespace, name)
    ]
    return sum(int(httpx.get(url, timeout=5).json()["pauses_total"]) for url in urls)


def _has_one_ready(api: client.ApiClient, namespace: str, name: str) -> bool:
    return len(ready_pods(api, namespace, name)) == 1


def _measured_ttft(api: client.ApiClient, namespace: str, name: str) -> float | None:
    value = (get_pool(api, namespace, name).get("status", {}).get("slo") or {}).get(
        "ttftP90Seconds"
    )
    return float(value) if isinstance(value, (int, float)) else None


def test_the_demo_pools_under_the_demo_load(
    kube_api: client.ApiClient, namespace: str, operator: ChartOperator, cluster: DevCluster
) -> None:
    # The demo's specs at one replica each, so that the short burst overloads both pools.
    for name, spec in demo_pools.pool_specs(min_replicas=1).items():
        create_pool(kube_api, namespace, genpool(name, _spec(spec)))
    for name in demo_pools.POOLS:
        wait_for(functools.partial(_has_one_ready, kube_api, namespace, name),
                 timeout=180, what=f"pool {name}: 1 ready worker")  # fmt: skip

    plan = plan_arrivals(PHASES, seed=1)
    assert {p.klass for p in plan} == {"interactive", "batch"}
    runs = run_phased_load(cluster.kubeconfig, plan, demo_pools.POOLS, namespace)

    end_s = sum(p.duration_s for p in PHASES)
    for name, (sent, samples) in runs.items():
        failed = [s.result.error for s in sent if not s.result.ok]
        assert len(sent) == len(plan) and not failed, (name, failed[:3])
        assert samples and all(x.ready >= 1 and x.pods >= x.ready for x in samples), name
    cost = demo_pools.cost_summary(runs, end_s)
    for name in demo_pools.POOLS:
        assert cost["pools"][name]["replica_seconds"] >= end_s * 0.9, cost  # >= 1 pod throughout
    assert cost["ratio"] is not None and cost["ratio"] > 0
    paused = {name: max(x.paused for x in samples) for name, (_, samples) in runs.items()}
    pauses = {name: _pauses_total(kube_api, namespace, name) for name in demo_pools.POOLS}
    print("demo pools under a short burst:", cost, "paused max:", paused, "pauses:", pauses)
    assert paused[demo_pools.REPLICAS_ONLY] == 0 and pauses[demo_pools.REPLICAS_ONLY] == 0, (
        paused,
        pauses,
    )
    assert pauses[demo_pools.GENPOOL] > 0, (paused, pauses)  # the burst put requests at risk
    # Operator-built pools key the demo's requests (no private field) and report their TTFT.
    for name in demo_pools.POOLS:
        ttft = functools.partial(_measured_ttft, kube_api, namespace, name)
        wait_for(ttft, timeout=30, what=f"pool {name}: a measured p90 TTFT in status.slo")
