"""The stats round's I/O half without a cluster: pod targets, sync checks, conditions,
and scraping/pushing against fake workers on loopback addresses."""

from __future__ import annotations

import asyncio

import httpx

from bench.fake_workers import FakeWorkerFleet
from genpool_core.live import LiveUpdate
from genpool_operator.conditions import Condition, merge_conditions, readiness_conditions
from genpool_operator.scrape import PodTarget, WorkerClient, in_sync, ready_targets
from genpool_operator.statsloop import push_live, scale_statefulset


def _pod(name: str, ip: str | None, *, ready: bool = True, phase: str = "Running") -> dict:
    status = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": {"name": name, "uid": name + "-uid"}, "status": status}


def test_ready_targets_keeps_running_ready_pods_with_ips_only() -> None:
    pods = [
        _pod("b", "127.0.0.11"),
        _pod("a", "127.0.0.10"),
        _pod("c", None),
        _pod("d", "127.0.0.12", ready=False),
        _pod("e", "127.0.0.13", phase="Pending"),
        {**_pod("f", "127.0.0.14"), "metadata": {"name": "f", "deletionTimestamp": "x"}},
    ]
    assert [t.name for t in ready_targets(pods)] == ["a", "b"]


def test_in_sync_needs_generation_and_every_value() -> None:
    update = LiveUpdate(generation=2, paused_cap=4, slack_s=0.5)
    assert in_sync({"generation": 2, "paused_cap": 4, "slack_s": 0.5}, update)
    assert not in_sync({"generation": 1, "paused_cap": 4, "slack_s": 0.5}, update)
    assert not in_sync({"generation": 2, "paused_cap": 3, "slack_s": 0.5}, update)
    assert not in_sync(None, update)


def test_conditions_keep_transition_time_until_status_flips() -> None:
    first = merge_conditions(
        None, readiness_conditions(2, 1, 2), now_iso="T0", observed_generation=1
    )
    ready = {c["type"]: c for c in first}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ReplicasNotReady"
    same = merge_conditions(
        first, [Condition("Ready", False, "ReplicasNotReady")], now_iso="T1", observed_generation=1
    )
    assert {c["type"]: c for c in same}["Ready"]["lastTransitionTime"] == "T0"
    flipped = merge_conditions(
        first, readiness_conditions(2, 2, 2), now_iso="T2", observed_generation=1
    )
    assert {c["type"]: c for c in flipped}["Ready"]["lastTransitionTime"] == "T2"


def test_push_reaches_out_of_sync_pods_and_reports_failures() -> None:
    async def scenario() -> None:
        fleet = FakeWorkerFleet(port=18931, token="s3cret")
        workers = await fleet.start(3)
        targets = [PodTarget(f"p{i}", w.host, "") for i, w in enumerate(workers)]
        live = {"resident_headroom": 8, "paused_cap": 5}
        async with httpx.AsyncClient() as http:
            client = WorkerClient(http, "s3cret", port=fleet.port)
            assert await push_live(client, targets, LiveUpdate(generation=1, **live)) == (3, {})
            assert [w.puts for w in workers] == [1, 1, 1]
            assert await push_live(client, targets, LiveUpdate(generation=1, **live)) == (3, {})
            assert [w.puts for w in workers] == [1, 1, 1]  # in sync: nothing sent
            recent = await client.gather(client.statlines, targets)
            assert all(lines and lines[-1].paused == 4 for lines in recent), recent
            wrong = WorkerClient(http, "nope", port=fleet.port)
            synced, errors = await push_live(wrong, targets, LiveUpdate(generation=2, **live))
            assert synced == 0 and set(errors) == {"p0", "p1", "p2"}
            assert "HTTP 401" in errors["p0"]
            dead = [PodTarget("gone", "127.0.9.9", "")]
            synced, errors = await push_live(client, dead, LiveUpdate(generation=2, **live))
            assert synced == 0 and "gone" in errors
        await fleet.stop()

    asyncio.run(scenario())


class _ScaleKube:
    """The two calls scale_statefulset makes, against one StatefulSet's scale."""

    def __init__(self, replicas: int | None) -> None:
        self.replicas = replicas
        self.patches: list[tuple[str, dict]] = []

    async def get(self, path: str) -> dict | None:
        return None if self.replicas is None else {"spec": {"replicas": self.replicas}}

    async def merge_patch(self, path: str, patch: dict) -> dict:
        self.patches.append((path, patch))
        self.replicas = patch["spec"]["replicas"]
        return {}


def test_scale_statefulset_writes_the_scale_subresource_only_on_a_change() -> None:
    kube = _ScaleKube(1)
    assert asyncio.run(scale_statefulset(kube, "ns", "pool", 3))  # type: ignore[arg-type]
    path = "/apis/apps/v1/namespaces/ns/statefulsets/pool-worker/scale"
    assert kube.patches == [(path, {"spec": {"replicas": 3}})]
    assert not asyncio.run(scale_statefulset(kube, "ns", "pool", 3))  # type: ignore[arg-type]
    gone = _ScaleKube(None)  # not created yet: the reconcile will, with the same count
    assert not asyncio.run(scale_statefulset(gone, "ns", "pool", 2))  # type: ignore[arg-type]
    assert len(kube.patches) == 1 and gone.patches == []
