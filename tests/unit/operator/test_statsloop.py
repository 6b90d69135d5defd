"""The operator's stats round without a cluster: freshness, generations, the status
record, and scraping/pushing against fake workers on loopback addresses."""

from __future__ import annotations

import asyncio

import httpx

from bench.fake_workers import STATLINE, FakeWorkerFleet
from genpool_core import tuner
from genpool_core.knobs import Knobs
from genpool_core.statline import parse_statline
from genpool_operator.conditions import Condition, merge_conditions, readiness_conditions
from genpool_operator.scrape import PodTarget, WorkerClient, in_sync, ready_targets
from genpool_operator.spec import GenPoolSpec
from genpool_operator.statsloop import (
    HISTORY_LIMIT,
    PoolMemory,
    RoundResult,
    desired_generation,
    freshness,
    knobs_in_force,
    live_config,
    push_live,
    tuning_record,
)

LINE = parse_statline(STATLINE.format(t=30.0))
SLO_SPEC = {"preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8}}


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


def test_freshness_stale_after_two_intervals_without_a_new_line() -> None:
    assert LINE is not None
    memory = PoolMemory()
    assert freshness(memory, {"p": LINE}, now=0.0, interval=10.0) == (False, True)
    assert freshness(memory, {"p": LINE}, now=15.0, interval=10.0) == (False, False)
    assert freshness(memory, {"p": LINE}, now=21.0, interval=10.0) == (True, False)
    newer = parse_statline(STATLINE.format(t=60.0))
    assert newer is not None
    assert freshness(memory, {"p": newer}, now=22.0, interval=10.0) == (False, True)


def test_no_reporting_pods_turn_stale_only_after_the_grace() -> None:
    memory = PoolMemory()
    assert freshness(memory, {}, now=100.0, interval=10.0) == (False, False)
    assert freshness(memory, {}, now=121.0, interval=10.0) == (True, False)


def test_generation_moves_only_when_live_values_change() -> None:
    live = {"resident_headroom": 6, "paused_cap": 6}
    assert desired_generation({}, live) == 1
    assert desired_generation({"appliedGeneration": 3, "liveConfig": live}, live) == 3
    assert desired_generation({"appliedGeneration": 3, "liveConfig": live}, {**live, "x": 1}) == 4


def test_knobs_in_force_prefer_status_and_clamp_to_spec_bounds() -> None:
    spec = GenPoolSpec.from_body(
        {**SLO_SPEC, "tuning": {"residentHeadroom": {"max": 8}, "pausedCap": {"max": 8}}}
    )
    assert knobs_in_force(spec, {}) == spec.start_knobs()
    status = {"residentHeadroom": 50, "pausedCap": 40}
    assert knobs_in_force(spec, status) == Knobs(8, 8)
    off = GenPoolSpec.from_body({})
    assert knobs_in_force(off, status) == Knobs(0, 0)


def test_live_config_carries_knobs_and_the_specs_live_fields() -> None:
    spec = GenPoolSpec.from_body({**SLO_SPEC, "preemption": {**SLO_SPEC["preemption"]}})
    live = live_config(spec, Knobs(5, 3))
    assert live["resident_headroom"] == 5 and live["paused_cap"] == 3
    assert live["slack_s"] == 0.5
    assert live["admission_target_min_s"] == 0.25 and live["admission_target_max_s"] == 30.0


def _result(decision: tuner.Decision | None) -> RoundResult:
    before = Knobs(6, 4)
    return RoundResult(None, False, decision, {"paused_cap": 4}, 2, 1, 2, {"p": "HTTP 500"}, before)


def test_tuning_record_appends_bounded_history_on_changes_only() -> None:
    before = Knobs(6, 4)
    state = tuner.TunerState()
    held = tuner.Decision(before, "hold", False, state)
    record = tuning_record({}, _result(held), "T0")
    assert "history" not in record and record["podsInSync"] == "1/2"
    assert record["appliedGeneration"] == 2 and record["lastReason"] == "hold"
    changed = tuner.Decision(Knobs(8, 6), "raise-cap", True, state)
    history = [{"time": str(i)} for i in range(HISTORY_LIMIT)]
    record = tuning_record({"history": history}, _result(changed), "T1")
    assert len(record["history"]) == HISTORY_LIMIT
    assert record["history"][-1]["to"] == {"residentHeadroom": 8, "pausedCap": 6}
    assert record["lastChange"]["from"] == {"residentHeadroom": 6, "pausedCap": 4}
    assert record["residentHeadroom"] == 8 and record["pausedCap"] == 6
    text = _result(changed).change_text()
    assert text == "raise-cap: headroom 6 -> 8, cap 4 -> 6"


def test_in_sync_needs_generation_and_every_value() -> None:
    live = {"paused_cap": 4, "slack_s": 0.5}
    assert in_sync({"generation": 2, "paused_cap": 4, "slack_s": 0.5}, 2, live)
    assert not in_sync({"generation": 1, "paused_cap": 4, "slack_s": 0.5}, 2, live)
    assert not in_sync({"generation": 2, "paused_cap": 3, "slack_s": 0.5}, 2, live)
    assert not in_sync(None, 2, live)


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
            assert await push_live(client, targets, 1, live) == (3, {})
            assert [w.puts for w in workers] == [1, 1, 1]
            assert await push_live(client, targets, 1, live) == (3, {})
            assert [w.puts for w in workers] == [1, 1, 1]  # in sync: nothing sent
            lines = await client.gather(client.statline, targets)
            assert all(line is not None and line.paused == 4 for line in lines)
            wrong = WorkerClient(http, "nope", port=fleet.port)
            synced, errors = await push_live(wrong, targets, 2, live)
            assert synced == 0 and set(errors) == {"p0", "p1", "p2"}
            assert "HTTP 401" in errors["p0"]
            dead = [PodTarget("gone", "127.0.9.9", "")]
            synced, errors = await push_live(client, dead, 2, live)
            assert synced == 0 and "gone" in errors
        await fleet.stop()

    asyncio.run(scenario())
