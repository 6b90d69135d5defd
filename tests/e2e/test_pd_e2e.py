"""P/D end to end on the local control plane (docs/pd.md): GenPools with a prefill tier,
driven with the ``openai`` SDK and no private field. SmolLM2: the P/D pool's greedy text
equals a colocated pool's, every request's KV pulled from the prefill tier. Synthetic: the
prefill tier scaled to two under load, then one prefill pod deleted under load: no request
fails, none hangs, and the decode worker follows the tier."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from kubernetes import client

from genpool_core.names import WORKER_PORT
from tests.integration.operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    create_pool,
    genpool,
    ready_pods,
    synthetic_spec,
)
from tests.node_cluster import ChartOperator
from tests.polling import wait_for
from tests.worker.pd_support import metric

ROLE_LABEL = "llm-d.ai/role"
PROMPTS = ("The capital of France is", "Once upon a time, in a small village,",
           "List three prime numbers:", "The best way to learn to code is")  # fmt: skip
SMOLLM2 = {
    "model": "smollm2-135m",
    "replicas": 1,
    "accelerator": "none",
    "engine": {"maxBatchSize": 4, "maxSeqLen": 512},
    "tuning": {"intervalSeconds": 3},
}


def _by_role(api: client.ApiClient, namespace: str, pool: str) -> dict[str, list[client.V1Pod]]:
    tiers: dict[str, list[client.V1Pod]] = {}
    for pod in ready_pods(api, namespace, pool):
        tiers.setdefault((pod.metadata.labels or {}).get(ROLE_LABEL, "none"), []).append(pod)
    return tiers


def _url(pod: client.V1Pod) -> str:
    return f"http://{pod.status.pod_ip}:{WORKER_PORT}"


def _ready_tiers(api: client.ApiClient, namespace: str, pool: str, num_prefill: int,
                 timeout: float) -> tuple[client.V1Pod, list[client.V1Pod]]:  # fmt: skip
    """The decode pod once ``num_prefill`` prefill pods are ready and it knows them all."""

    def ready() -> tuple[client.V1Pod, list[client.V1Pod]] | None:
        tiers = _by_role(api, namespace, pool)
        if len(tiers.get("decode", [])) != 1 or len(tiers.get("prefill", [])) != num_prefill:
            return None
        (decode,) = tiers["decode"]
        wanted = sorted(f"{p.status.pod_ip}:{WORKER_PORT}" for p in tiers["prefill"])
        told = httpx.get(_url(decode) + "/prefillers", timeout=5).json()["endpoints"]
        return (decode, tiers["prefill"]) if sorted(told) == wanted else None

    found: tuple[client.V1Pod, list[client.V1Pod]] = wait_for(
        ready, f"{pool}: 1 decode pod told {num_prefill} ready prefill pods", timeout, interval=1
    )
    return found


def _complete(url: str, prompt: str, max_tokens: int = 16) -> str:
    sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = sdk.models.list().data[0].id  # a model the worker does not serve is a 404
    reply = sdk.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].text


def test_a_smollm2_pd_pool_answers_as_a_colocated_pool(
    kube_api: client.ApiClient, namespace: str, operator: ChartOperator
) -> None:
    create_pool(kube_api, namespace, genpool("pd", SMOLLM2 | {"prefill": {"replicas": 1}}))
    create_pool(kube_api, namespace, genpool("colo", SMOLLM2))
    decode, (prefill,) = _ready_tiers(kube_api, namespace, "pd", 1, timeout=300)
    (colocated,) = wait_for(lambda: ready_pods(kube_api, namespace, "colo"), "colo ready", 300)
    for prompt in PROMPTS:
        assert _complete(_url(decode), prompt) == _complete(_url(colocated), prompt), prompt
    assert metric(_url(decode), "genpool_kv_transfers_total", side="import", outcome="ok") == len(
        PROMPTS
    )
    assert metric(_url(prefill), "genpool_kv_transfers_total", side="export", outcome="ok") == len(
        PROMPTS
    )
    assert metric(_url(decode), "genpool_kv_transfer_fallbacks_total") == 0
    assert metric(_url(colocated), "genpool_kv_transfers_total") == 0


class Load:
    """Closed-loop SDK clients against one decode worker until stopped: every reply
    checked against the synthetic model's text for its prompt."""

    def __init__(self, url: str, expected: dict[str, str], clients: int = 6) -> None:
        self.url, self.expected, self.clients = url, expected, clients
        self.done = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(clients)
        self._futures = [self._pool.submit(self._client, i) for i in range(clients)]

    def _client(self, index: int) -> None:
        i = index
        while not self._stop.is_set():
            prompt = PROMPTS[i % len(PROMPTS)]
            i += 1
            try:
                text = _complete(self.url, prompt, max_tokens=24)
            except Exception as exc:  # a failure is counted, never raised here
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self.done += 1
                if text != self.expected[prompt]:
                    self.failures.append(f"{prompt!r}: {text!r}")

    def stop(self, timeout: float) -> None:
        self._stop.set()
        started = time.monotonic()
        for future in self._futures:  # none may hang: each call has its own timeout too
            future.result(timeout=max(1.0, timeout - (time.monotonic() - started)))
        self._pool.shutdown()


def test_the_prefill_tier_scales_and_loses_a_pod_under_load(
    kube_api: client.ApiClient, namespace: str, operator: ChartOperator
) -> None:
    spec = synthetic_spec(prefill={"replicas": 1}, engine={"maxBatchSize": 8})
    create_pool(kube_api, namespace, genpool("pd", spec))
    decode, _ = _ready_tiers(kube_api, namespace, "pd", 1, timeout=120)
    url = _url(decode)
    expected = {p: _complete(url, p, max_tokens=24) for p in PROMPTS}
    load = Load(url, expected)
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "pd", {"spec": {"prefill": {"replicas": 2}}}
    )
    _, prefills = _ready_tiers(kube_api, namespace, "pd", 2, timeout=120)
    wait_for(lambda: all(metric(_url(p), "genpool_kv_transfers_total", side="export") > 0
                         for p in prefills), "both prefill pods serving legs", 60)  # fmt: skip
    victim = prefills[0]
    client.CoreV1Api(kube_api).delete_namespaced_pod(victim.metadata.name, namespace)
    before = load.done
    wait_for(lambda: load.done >= before + 20, "requests served after the pod's deletion", 120)
    _ready_tiers(kube_api, namespace, "pd", 2, timeout=120)  # the pod is back, and told
    load.stop(timeout=150)
    assert load.failures == [], load.failures[:5]
    assert load.done > 40
    assert metric(url, "genpool_kv_transfers_total", side="import", outcome="ok") > 0
