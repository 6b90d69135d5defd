"""The OpenAI SDK through GIE's endpoint picker to a GenPool, and the pool's SLO from it.

The picker is GIE's own ``cmd/epp`` (unmodified, endpoint_picker.epp_binary) for the
InferencePool the operator writes; tests/integration/epp_gateway.py plays the gateway
(Envoy's ext_proc client). The SDK sends what clients send: no private ``genpool`` body
field, so the workers key each request by the gateway's ``x-genpool-arrival-time``. The
traffic is spread over both workers by the picker, and the operator reports the TTFT p90
it measured from it in ``status.slo`` and the ``SLOMet`` condition.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from kubernetes import client

from genpool_core.names import WORKER_PORT
from genpool_operator.scaling_plan import SLO_MET
from tests.conftest import DevCluster
from tests.integration.endpoint_picker import EndpointPicker, endpoint_picker
from tests.integration.epp_gateway import EppGateway, running_gateway
from tests.integration.inference_pool_harness import (
    get_inference_pool,
    routed_spec,
)
from tests.integration.operator_harness import (
    OperatorProcess,
    create_pool,
    genpool,
    get_pool,
    ready_pods,
)
from tests.polling import wait_for
from tests.worker.pd_support import metric

POOL = "sdk-routed"
MODEL = "synthetic:tiny"
SLO_TTFT_S = 5.0  # generous: a synthetic pool under light load is well within it
LOAD_THREADS = 4
# A worker's count of completion requests it served: genpool_requests_total{...,outcome="ok"} 3.0
OK_REQUESTS = re.compile(r'^genpool_requests_total\{[^}]*outcome="ok"[^}]*\} (\S+)$', re.MULTILINE)
# The picker's log line for each request it scheduled (--v=4), naming the pod it picked.
PICKED = re.compile(r'\tRequest handled\t.*"endpoint": "([^"]+)"')
# The picker's own accounting: requests it scheduled, and requests whose response it saw end.
PICKER_COUNTS = {
    name: re.compile(rf"^{name}\{{[^}}]*\}} (\S+)$", re.MULTILINE)
    for name in (
        "inference_objective_request_total",
        "inference_objective_request_duration_seconds_count",
    )
}


@pytest.fixture
def picker(cluster: DevCluster, namespace: str, tmp_path: Path) -> Iterator[EndpointPicker]:
    log = tmp_path / "epp.log"
    with endpoint_picker(cluster.kubeconfig, namespace, POOL, log, plaintext=True) as epp:
        yield epp


def _picker_metrics(epp: EndpointPicker) -> str | None:
    assert epp.is_running(), epp.log_text()[-4000:]
    try:
        response = httpx.get(f"http://127.0.0.1:{epp.metrics_port}/metrics", timeout=5)
    except httpx.TransportError:
        return None  # still starting
    return response.raise_for_status().text


def _picker_ready_pods(epp: EndpointPicker) -> float | None:
    text = _picker_metrics(epp)
    return epp.pool_gauges(text, POOL).get("inference_pool_ready_pods") if text else None


def _picker_counts(epp: EndpointPicker) -> dict[str, float]:
    text = _picker_metrics(epp) or ""
    return {name: sum(map(float, rx.findall(text))) for name, rx in PICKER_COUNTS.items()}


def _ready_ips(kube_api: client.ApiClient, namespace: str) -> list[str] | None:
    """The IPs of the pool's two worker pods once both are ready."""
    ips = [str(p.status.pod_ip) for p in ready_pods(kube_api, namespace, POOL) if p.status]
    return ips if len(ips) == 2 else None


def _served_ok(pod_ip: str) -> float:
    text = httpx.get(f"http://{pod_ip}:{WORKER_PORT}/metrics", timeout=10).text
    return sum(float(v) for v in OK_REQUESTS.findall(text))


def _prompt() -> str:
    return f"route {uuid.uuid4().hex[:8]} through the picker"  # unique: no prefix affinity


class Load:
    """SDK traffic through the gateway until stopped: streamed completions and chat."""

    def __init__(self, sdk: openai.OpenAI) -> None:
        self.sdk = sdk
        self.stop = threading.Event()
        self.num_ok = 0
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(LOAD_THREADS)]

    def _run(self, index: int) -> None:
        while not self.stop.is_set():
            try:
                if index % 2:
                    chat = self.sdk.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": _prompt()}],
                        max_tokens=24, stream=True,
                    )  # fmt: skip
                    text = "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
                else:
                    stream = self.sdk.completions.create(
                        model=MODEL, prompt=_prompt(), max_tokens=24, stream=True
                    )
                    text = "".join(c.choices[0].text for c in stream if c.choices)
                assert text, "an empty reply"
                self.num_ok += 1
            except Exception as exc:  # recorded, and the test fails on any
                self.failures.append(repr(exc))

    def check(self) -> bool:
        """True while every request was answered; the first failure fails the test."""
        assert self.failures == [], self.failures[:5]
        return True

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)


def _slo_status(kube_api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    """The status once it shows a measured TTFT p90 and SLOMet True (else None)."""
    status: dict[str, Any] = get_pool(kube_api, namespace, POOL).get("status") or {}
    p90 = (status.get("slo") or {}).get("ttftP90Seconds")
    conditions = status.get("conditions") or []
    met: dict[str, Any] = next((c for c in conditions if c.get("type") == SLO_MET), {})
    is_measured = isinstance(p90, (int, float)) and p90 > 0
    return status if is_measured and met.get("status") == "True" else None


def _one_of_each(sdk: openai.OpenAI) -> None:
    """Completions and chat, streamed and not, one with llm-d's SLO headers: all answered."""
    raw = sdk.completions.with_raw_response.create(model=MODEL, prompt=_prompt(), max_tokens=8)
    # The EPP's response-headers phase marks what went through it (v1.2.0, for debugging).
    assert raw.headers.get("x-went-into-resp-headers") == "true"
    completion = raw.parse()
    assert completion.choices[0].text and completion.usage
    assert completion.usage.completion_tokens == 8
    chunks = list(sdk.completions.create(model=MODEL, prompt=_prompt(), max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"
    messages: Any = [{"role": "user", "content": _prompt()}]
    chat = sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"
    deltas = list(sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                              stream=True))  # fmt: skip
    assert "".join(d.choices[0].delta.content or "" for d in deltas if d.choices)
    slo_headers = {"x-llm-d-slo-ttft-ms": "10000", "x-llm-d-slo-tpot-ms": "200"}
    stated = sdk.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, extra_headers=slo_headers
    )
    assert stated.choices[0].message.content
    # A refusal by the picker is the gateway's JSON error, with the picker's reason.
    with pytest.raises(openai.BadRequestError, match=r"endpoint picker: .*at least one message"):
        sdk.chat.completions.create(model=MODEL, messages=[], max_tokens=8)


def test_the_openai_sdk_reaches_the_pool_through_the_endpoint_picker(
    kube_api: client.ApiClient,
    namespace: str,
    gie_crds: None,
    operator: OperatorProcess,
    picker: EndpointPicker,
) -> None:
    spec = routed_spec(replicas=2)
    spec.update(
        slo={"ttftP90Seconds": SLO_TTFT_S, "attainment": 0.8}, tuning={"intervalSeconds": 5}
    )
    create_pool(kube_api, namespace, genpool(POOL, spec))
    ips = wait_for(lambda: _ready_ips(kube_api, namespace), timeout=120, what="2 ready workers")
    endpoints = {f"{ip}:{WORKER_PORT}" for ip in ips}
    wait_for(lambda: get_inference_pool(kube_api, namespace, POOL), what="the InferencePool")
    picker.start()
    wait_for(
        lambda: _picker_ready_pods(picker) == 2,
        timeout=60,
        what="the picker holding fresh metrics of both workers",
    )

    gateway: EppGateway
    with running_gateway(f"127.0.0.1:{picker.grpc_port}") as (gateway, url):
        # A GET has no body: the picker routes it to a random pod (v1.2.0).
        wait_for(
            lambda: httpx.get(f"{url}/v1/models", timeout=10).status_code == 200,
            what="the gateway and the picker's ext_proc port answering",
        )
        gateway.routed.clear()  # from here on, only completions: each one a worker's "ok"
        counted_before = _picker_counts(picker)
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        _one_of_each(sdk)
        with Load(sdk) as load:
            status = wait_for(
                lambda: _slo_status(kube_api, namespace) if load.check() else None,
                timeout=180,
                what=f"status.slo.ttftP90Seconds and {SLO_MET}=True from the routed traffic",
            )
        assert load.failures == [], load.failures[:5]
        served = {ip: _served_ok(ip) for ip in ips}
        # The picker saw every response to its end (it records a latency only then): the
        # response phases went through it. A stream's end may reach it just after the SDK's.
        num_routed = sum(gateway.routed.values())
        wait_for(
            lambda: all(
                v - counted_before[k] == num_routed for k, v in _picker_counts(picker).items()
            ),
            timeout=15,
            what=f"the picker counting {num_routed} requests and their ends",
        )

    print(f"routed by the picker: {dict(gateway.routed)}; served per pod: {served}")
    print(f"status.slo: {status['slo']}; load requests answered: {load.num_ok}")
    assert load.num_ok > 0
    # The picker spread the traffic over both pods, and each served what it was sent.
    assert set(gateway.routed) == endpoints
    for ip in ips:
        sent = gateway.routed[f"{ip}:{WORKER_PORT}"]
        assert sent > 0 and served[ip] == sent, (ip, sent, served)
    # The gateway went where the picker said.
    assert Counter(PICKED.findall(picker.log_text())) == gateway.routed
    # Every request was keyed by the gateway's clock (its x-genpool-arrival-time), none
    # by a worker's receipt or a body stamp, and no stamp was old enough to be clamped.
    for ip in ips:
        url = f"http://{ip}:{WORKER_PORT}"
        by_header = metric(url, "genpool_arrival_keys_total", source="header", clamped="false")
        assert by_header == served[ip], (ip, by_header, served[ip])
        for source in ("receipt", "body", "unkeyed"):
            assert metric(url, "genpool_arrival_keys_total", source=source) == 0, (ip, source)
        assert metric(url, "genpool_arrival_keys_total", clamped="true") == 0, ip
    condition = next(c for c in status["conditions"] if c["type"] == SLO_MET)
    assert condition["reason"] == "WithinTarget", condition
    assert 0 < status["slo"]["ttftP90Seconds"] <= SLO_TTFT_S
