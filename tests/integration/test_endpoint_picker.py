"""GIE's own endpoint picker, built unmodified from its Go module, reads a GenPool's workers.

The operator writes the InferencePool (spec.inferencePool); the picker finds the worker pods
through it and scrapes their model-server gauges with its default metric names
(``vllm:num_requests_waiting``, ``vllm:gpu_cache_usage_perc`` in v1.2.0). Its own
``inference_pool_*`` gauges are averages of what it scraped, so they show it read ours: the
number of pods with fresh metrics, and the mean queue and KV utilisation while the workers
are loaded, back to 0 when they are idle again.

The first run builds ``epp`` (endpoint_picker.epp_binary; minutes), later runs reuse it.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from genpool_core.names import WORKER_PORT
from tests.conftest import DevCluster
from tests.integration.endpoint_picker import EndpointPicker, endpoint_picker
from tests.integration.inference_pool_harness import (
    get_inference_pool,
    routed_spec,
)
from tests.integration.operator_harness import (
    OperatorProcess,
    create_pool,
    genpool,
    ready_pods,
)
from tests.polling import wait_for

POOL = "picked"
NUM_REQUESTS_PER_POD = 24  # three times maxBatchSize (8): a queue builds at every worker


@pytest.fixture
def picker(cluster: DevCluster, namespace: str, tmp_path: Path) -> Iterator[EndpointPicker]:
    log = tmp_path / "epp.log"
    with endpoint_picker(cluster.kubeconfig, namespace, POOL, log) as epp:
        yield epp


def _picker_gauges(epp: EndpointPicker) -> dict[str, float]:
    """The picker's pool gauges; none while it is still starting (not listening yet)."""
    assert epp.is_running(), epp.log_text()[-4000:]
    try:
        response = httpx.get(f"http://127.0.0.1:{epp.metrics_port}/metrics", timeout=5)
    except httpx.TransportError:
        return {}
    response.raise_for_status()
    return epp.pool_gauges(response.text, POOL)


def _load(pod_ip: str) -> int:
    body = {"prompt": "route me", "max_tokens": 300}
    url = f"http://{pod_ip}:{WORKER_PORT}/v1/completions"
    return httpx.post(url, json=body, timeout=120).status_code


def test_the_endpoint_picker_reads_the_workers_gauges(
    kube_api: client.ApiClient,
    namespace: str,
    gie_crds: None,
    operator: OperatorProcess,
    picker: EndpointPicker,
) -> None:
    create_pool(kube_api, namespace, genpool(POOL, routed_spec(replicas=2)))
    pods = wait_for(
        lambda: len(p := ready_pods(kube_api, namespace, POOL)) == 2 and p,
        timeout=120,
        what="2 ready worker pods",
    )
    wait_for(lambda: get_inference_pool(kube_api, namespace, POOL), what="the InferencePool")
    picker.start()
    wait_for(
        lambda: _picker_gauges(picker).get("inference_pool_ready_pods") == 2,
        timeout=60,
        what="the picker holding fresh metrics of both workers",
    )

    ips = [p.status.pod_ip for p in pods] * NUM_REQUESTS_PER_POD
    with ThreadPoolExecutor(max_workers=len(ips)) as load:
        done = load.map(_load, ips)
        loaded = wait_for(
            lambda: (
                (g := _picker_gauges(picker))
                and g.get("inference_pool_average_queue_size", 0) > 0
                and g.get("inference_pool_average_kv_cache_utilization", 0) > 0
                and g
            ),
            timeout=60,
            what="a queue and KV utilisation in the picker's view of the pool",
        )
        assert list(done) == [200] * len(ips)
    print(f"the picker's view of {POOL} under load: {loaded}")
    assert loaded["inference_pool_average_kv_cache_utilization"] <= 1.0
    assert loaded["inference_pool_ready_pods"] == 2
    wait_for(
        lambda: (
            (g := _picker_gauges(picker))
            and g.get("inference_pool_average_queue_size") == 0
            and g.get("inference_pool_average_kv_cache_utilization") == 0
        ),
        timeout=30,
        what="an idle pool in the picker's view",
    )
    # Its log names the scrape target of each pod: the pod IP and the InferencePool's port.
    log = picker.log_text()
    for pod in pods:
        assert f"MetricsHost:{pod.status.pod_ip}:{WORKER_PORT}" in log
