"""The status reducer: writers record facts, one function derives phase and readiness."""

from __future__ import annotations

from typing import Any

from genpool_operator.conditions import Condition
from genpool_operator.pod_failures import DEGRADED
from genpool_operator.pool_status import (
    WorkloadFacts,
    is_news,
    reduce_status,
    without_condition,
)

CRASHING = Condition(DEGRADED, True, "WorkerCrashLoop", "pod p-0: exit 1")
HEALTHY = Condition(DEGRADED, False, "SpecApplied", "children applied, no worker failing")


def reduce(status: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return {**status, **reduce_status(status, now_text="T", observed_generation=1, **kwargs)}


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_phase_and_readiness_come_from_the_workload_and_degraded_facts_together() -> None:
    status = reduce({}, workload=WorkloadFacts(2, 2, 1, 2), facts=[HEALTHY])
    assert (status["phase"], status["ready"], status["readyReplicas"]) == ("Progressing", "1/2", 1)
    assert conditions(status)["Ready"] == ("False", "ReplicasNotReady")
    # the pod watch records a crash: phase and Progressing follow without the counts
    status = reduce(status, facts=[CRASHING])
    assert status["phase"] == "Degraded"
    assert conditions(status)["Progressing"] == ("False", "WorkersFailing")
    # the StatefulSet mirror then reports all ready: still Degraded (the fact stands)
    status = reduce(status, workload=WorkloadFacts(2, 2, 2, 2))
    assert status["phase"] == "Degraded" and status["ready"] == "2/2"
    status = reduce(status, facts=[HEALTHY])
    assert status["phase"] == "Running"
    assert conditions(status)["Progressing"] == ("False", "Stable")


def test_desired_is_the_statefulsets_not_the_specs() -> None:
    """The scaler set 4 where spec.replicas says 2: 2 ready of 4 is Progressing."""
    status = reduce({}, workload=WorkloadFacts(desired=4, replicas=4, ready=2, updated=4))
    assert (status["phase"], status["ready"]) == ("Progressing", "2/4")
    assert reduce({}, workload=WorkloadFacts(0))["phase"] == "Idle"


def test_without_workload_facts_only_the_facts_are_written() -> None:
    patch = reduce_status({}, facts=[HEALTHY], now_text="T", observed_generation=1)
    assert set(patch) == {"conditions"} and conditions(patch) == {
        DEGRADED: ("False", "SpecApplied")
    }


def test_the_facts_round_trip_and_garbage_reads_as_zero() -> None:
    facts = WorkloadFacts(3, 3, 2, 1)
    assert WorkloadFacts.from_status({"workload": facts.to_status()}) == facts
    assert WorkloadFacts.from_status({}) is None
    bad = {"workload": {"desired": "3", "replicas": -1, "ready": True}}
    assert WorkloadFacts.from_status(bad) == WorkloadFacts(0, 0, 0, 0)


def test_news_ignores_timestamps_and_a_dropped_fact_is_gone() -> None:
    status = reduce({}, workload=WorkloadFacts(1, 1, 1, 1), facts=[HEALTHY])
    again = reduce_status(status, now_text="later", observed_generation=1)
    assert not is_news(status, again)
    assert is_news(status, reduce_status(status, facts=[CRASHING], now_text="T",
                                         observed_generation=1))  # fmt: skip
    pool = Condition("InferencePoolReady", True, "Applied", "ok")
    with_pool = reduce(status, facts=[pool])
    dropped = reduce(without_condition(with_pool, "InferencePoolReady"))
    assert "InferencePoolReady" not in conditions(dropped)
