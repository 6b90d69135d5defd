"""End to end on the real node: the chart's operator keeps an autoscaled pool of synthetic
workers at its SLO.

A pool min 1 / max 3 takes a load step and scales up until the SLO holds again; the
operator's process is killed at the plateau, the kubelet restarts its container and the
StatefulSet's replicas do not move; the load falls and the pool scales down, draining the
leaving pods, with not one accepted request lost. Intervals and windows are short so that
it runs in minutes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from kubernetes import client

from genpool_core.names import GROUP_VERSION
from genpool_devcluster.loadgen import PROMPTS, PodPicker, RequestResult, one_request
from genpool_operator.builders import statefulset_name
from genpool_operator.kube import Kube, load_config
from tests.conftest import DevCluster, Kubectl
from tests.integration.operator_harness import create_pool, get_pool, synthetic_spec
from tests.node_cluster import ChartOperator
from tests.polling import wait_for

POOL = "auto"
T = TypeVar("T")
SLO_TTFT_S = 0.5
# A closed-loop user keeps a batch position busy only for its duty cycle: its request's
# service over its whole loop, client and HTTP included. Nine users of 0.8 s requests kept
# 8.8 positions busy on an idle machine, and on a loaded one (CI, 2026-12-06) few enough
# that the plateau consolidated to two during the restart check. Ten users of 1.3 s
# requests keep about ten busy (10.2 in a window measured beside the model tier): more
# than two replicas of four hold at any learned capacity once the scaler's level has
# caught up with the step (the restart check waits for that), and three hold them with
# two positions to spare for the round-robin's imbalance. Two users need one.
HIGH_CLIENTS, LOW_CLIENTS = 10, 2
UP_REASONS = ("up-forecast", "up-backlog", "up-tail")
MAX_TOKENS = 40  # about 1.3 s of decode per request at the synthetic model's step time
SPEC = synthetic_spec(
    replicas=1,
    engine={"maxBatchSize": 4},
    preemption={"mode": "Off"},  # the scaler alone: TTFT is its only lever
    tuning={"intervalSeconds": 3},
    drain={"timeoutSeconds": 20},
    slo={"ttftP90Seconds": SLO_TTFT_S},
    autoscaling={
        "enabled": True, "minReplicas": 1, "maxReplicas": 3,
        "scaleDownStabilizationSeconds": 12, "maxStep": 2,
    },
)  # fmt: skip


class SteppedLoad:
    """Closed-loop users against the pool's ready pods, on their own thread; ``clients``
    can be changed while it runs (users above it wait). Every result is kept with its
    end time."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig, self.namespace = kubeconfig, namespace
        self.clients = 0
        self.results: list[tuple[float, RequestResult]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self, clients: int) -> SteppedLoad:
        self.clients = clients
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, RequestResult]]:
        self._stop.set()
        self._thread.join(180)
        assert not self._thread.is_alive(), "load generator did not stop"
        return self.results

    async def _run(self) -> None:
        kube = Kube(load_config(str(self.kubeconfig)))
        picker = PodPicker(kube, self.namespace, POOL)
        stop = asyncio.Event()
        refresher = asyncio.create_task(picker.keep_fresh(stop))
        limits = httpx.Limits(max_connections=4 * HIGH_CLIENTS)
        try:
            async with httpx.AsyncClient(limits=limits) as http:
                await asyncio.gather(*(self._user(http, picker, i) for i in range(HIGH_CLIENTS)))
        finally:
            stop.set()
            await refresher
            await kube.aclose()

    async def _user(self, http: httpx.AsyncClient, picker: PodPicker, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            if index >= self.clients:
                # An idle user looks again for a raised client count: its polling period.
                await asyncio.sleep(0.2)
                continue
            prompt = PROMPTS[(index + n) % len(PROMPTS)]
            result = await one_request(http, picker, prompt, MAX_TOKENS)
            self.results.append((time.time(), result))
            n += 1


def _status(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = get_pool(api, namespace, POOL).get("status") or {}
    return status


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _inputs(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    inputs: dict[str, Any] = (_status(api, namespace).get("scaling") or {}).get("inputs") or {}
    return inputs


def _explain(api: client.ApiClient, namespace: str) -> str:
    """The scaler's view, for a failure message."""
    status = _status(api, namespace)
    keys = ("desiredReplicas", "scaling", "slo", "preemption", "workersReporting")
    return repr({key: status.get(key) for key in keys})


def _wait_explained(api: client.ApiClient, namespace: str, check: Callable[[], T | None],
                    what: str, timeout: float) -> T:  # fmt: skip
    """``wait_for``, a timeout's message carrying the scaler's view."""
    try:
        return wait_for(check, what, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {_explain(api, namespace)}") from None


def _statefulset_replicas(api: client.ApiClient, namespace: str) -> int:
    scale = client.AppsV1Api(api).read_namespaced_stateful_set_scale(
        statefulset_name(POOL), namespace
    )
    return int(scale.spec.replicas)


def _events(api: client.ApiClient, namespace: str) -> list[tuple[str, str]]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={POOL}"
    )
    ordered = sorted(events.items, key=lambda e: e.last_timestamp or e.event_time or 0)
    return [(e.reason, e.message) for e in ordered]


def _hold_steady_through_restart(
    operator: ChartOperator, api: client.ApiClient, namespace: str, seconds: float
) -> list[int]:
    """Kill the operator's process, let the kubelet restart its container, and sample
    the StatefulSet's replicas all along, then for ``seconds`` after it is Ready again."""
    samples = [_statefulset_replicas(api, namespace)]
    restarts = operator.restarts()
    operator.kill()

    def restarted() -> bool:
        samples.append(_statefulset_replicas(api, namespace))
        return operator.restarts() > restarts and operator.is_ready()

    wait_for(restarted, "the kubelet restarts the operator", 120, interval=0.5)
    # Sampling for a fixed window is the check (nothing may move in it), not a wait.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(_statefulset_replicas(api, namespace))
        time.sleep(0.5)
    return samples


def _check_the_scalers_reasoning(
    api: client.ApiClient, kubectl: Kubectl, namespace: str
) -> list[tuple[int, int, str]]:
    """Up 1 -> 3 on the law's up terms and back to 1 by consolidation, each change an
    Event that quotes the inputs, the latest inputs in the status and -o wide."""
    status = _status(api, namespace)
    history = [h for h in status["tuning"]["history"] if h.get("kind") == "Replicas"]
    steps = [(h["from"]["replicas"], h["to"]["replicas"], h["reason"]) for h in history]
    assert steps[0][0] == 1 and max(s[1] for s in steps) == 3 and steps[-1][1] == 1, steps
    assert all(r in UP_REASONS if b > a else r == "down-consolidate" for a, b, r in steps), steps
    events = _events(api, namespace)
    reasons = [reason for reason, _ in events]
    assert "ScaledUp" in reasons and "ScaledDown" in reasons and "SLOMissed" in reasons
    assert reasons.index("ScaledUp") < reasons.index("ScaledDown")
    scaled = [m for reason, m in events if reason in ("ScaledUp", "ScaledDown")]
    assert all("req/s per replica" in m and "backlog" in m for m in scaled), scaled
    inputs = status["scaling"]["inputs"]
    assert inputs["capacityPerReplica"] > 0 and "pauseBudget" not in inputs, inputs  # mode Off

    def wide_shows_the_inputs() -> bool:  # a round may land between the two reads
        wide = kubectl("get", "gp", POOL, "-n", namespace, "-o", "wide").stdout
        header, row = wide.splitlines()[:2]
        shown = float(row[header.index("PER-REPLICA") :].split()[0])
        now = _status(api, namespace)["scaling"]["inputs"]["capacityPerReplica"]
        return bool(shown == pytest.approx(now, rel=0.01))

    wait_for(wide_shows_the_inputs, "-o wide's Per-Replica column", 30)
    return steps


def test_autoscaled_pool_meets_its_slo_scales_down_draining_and_survives_a_restart(
    cluster: DevCluster,
    kube_api: client.ApiClient,
    kubectl: Kubectl,
    namespace: str,
    operator: ChartOperator,
) -> None:
    body = {"apiVersion": GROUP_VERSION, "kind": "GenPool", "metadata": {"name": POOL}}
    create_pool(kube_api, namespace, {**body, "spec": SPEC})
    wait_for(lambda: _status(kube_api, namespace).get("readyReplicas") == 1, "1 ready", 180)

    # The step: ten users on one replica of four batch positions.
    load = SteppedLoad(cluster.kubeconfig, namespace).start(HIGH_CLIENTS)
    wait_for(
        lambda: _condition(_status(kube_api, namespace), "SLOMet").get("status") == "False",
        "the SLO missed under the step",
        60,
    )
    wait_for(
        lambda: _status(kube_api, namespace).get("readyReplicas") == 3,
        "three ready replicas",
        240,
    )
    assert _status(kube_api, namespace)["desiredReplicas"] == 3
    met = _wait_explained(
        kube_api,
        namespace,
        lambda: (c := _condition(_status(kube_api, namespace), "SLOMet"))["status"] == "True" and c,
        "the SLO met again at three replicas",
        120,
    )
    assert met["reason"] == "WithinTarget", met

    # The plateau settles when the scaler's smoothed rate (its level, which follows the
    # load over about a minute at any interval) has caught up with the step: until then
    # consolidation, which holds that level, may ask for two within this test's 12 s down
    # window (and the backlog for three again), a move the restart check would blame on
    # the restart. Once the level holds three it only climbs towards the step.
    _wait_explained(kube_api, namespace,
                    lambda: _inputs(kube_api, namespace).get("consolidatedReplicas") == 3,
                    "the scaler's level holds three", 90)  # fmt: skip

    # An operator restart at the plateau: nothing resets the scaler's replicas.
    samples = _hold_steady_through_restart(operator, kube_api, namespace, seconds=15)
    assert set(samples) == {3}, f"{samples}; {_explain(kube_api, namespace)}"
    assert _status(kube_api, namespace)["desiredReplicas"] == 3

    # The load falls: after the down window the pool shrinks, draining as it goes.
    fell_at = time.time()
    load.clients = LOW_CLIENTS
    _wait_explained(kube_api, namespace, lambda: _statefulset_replicas(kube_api, namespace) == 1,
                    "scaled down to 1", 120)  # fmt: skip
    wait_for(lambda: _status(kube_api, namespace).get("replicas") == 1, "one pod left", 120)
    results = load.stop()  # each user finishes the request it has in flight first

    failed = [r for _, r in results if not r.ok]
    assert not failed, failed[:5]
    served_while_down = {r.pod for t, r in results if t > fell_at}
    assert len(served_while_down) > 1, "the leaving pods served requests until drained"
    steps = _check_the_scalers_reasoning(kube_api, kubectl, namespace)
    header, row = kubectl("get", "gp", POOL, "-n", namespace).stdout.splitlines()[:2]
    # Cut by the header's column starts: a column may be empty (Below-T with mode Off).
    at = header.index("DESIRED")
    assert row[at : header.index("SLO")].strip() == "1" and header.index("SLO") > at, (header, row)
    text = operator.metrics()
    assert f'genpool_operator_desired_replicas{{namespace="{namespace}",pool="{POOL}"}} 1.0' in text
    assert "genpool_operator_decisions_total{" in text
    assert "genpool_operator_round_duration_seconds_count{" in text
    leaving = Counter(r.pod for t, r in results if t > fell_at and r.pod != f"{POOL}-worker-0")
    print(
        f"e2e autoscaling: {len(results)} requests, 0 failed; after the load fell, "
        f"{sum(leaving.values())} finished on the leaving pods {dict(sorted(leaving.items()))}; "
        f"replica changes {steps}"
    )


def test_advisory_pool_records_what_it_would_do_and_applies_nothing(
    cluster: DevCluster, kube_api: client.ApiClient, namespace: str, operator: ChartOperator
) -> None:
    spec = {**SPEC, "advisory": True}
    body = {"apiVersion": GROUP_VERSION, "kind": "GenPool", "metadata": {"name": POOL}}
    create_pool(kube_api, namespace, {**body, "spec": spec})
    wait_for(lambda: _status(kube_api, namespace).get("readyReplicas") == 1, "1 ready", 180)
    load = SteppedLoad(cluster.kubeconfig, namespace).start(HIGH_CLIENTS)
    try:
        status = wait_for(
            lambda: (s := _status(kube_api, namespace)).get("desiredReplicas", 1) > 1 and s,
            "advice to scale up",
            90,
        )
        advised_at = operator.rounds(namespace, POOL)
        wait_for(lambda: operator.rounds(namespace, POOL) >= advised_at + 3, "3 more rounds", 60)
        assert _statefulset_replicas(kube_api, namespace) == 1  # still nothing applied
    finally:
        results = load.stop()
    assert status["scaling"]["advisory"] is True
    change = status["scaling"]["lastChange"]
    assert change["advisory"] is True and change["from"] == 1 and change["to"] > 1
    assert any(
        h.get("kind") == "Replicas" and h.get("advisory") for h in status["tuning"]["history"]
    )
    assert _status(kube_api, namespace)["replicas"] == 1  # no pod was added
    scaled = [m for reason, m in _events(kube_api, namespace) if reason == "ScaledUp"]
    assert scaled and all(m.startswith("advisory, not applied: ") for m in scaled), scaled
    assert not [r for _, r in results if not r.ok]
    text = operator.metrics()
    assert 'kind="replicas"' in text and 'advisory="true"' in text
