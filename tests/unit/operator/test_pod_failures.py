"""Degraded from the spec check and the workers' container statuses (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from genpool_operator.pod_failures import (
    MIN_CRASH_LOOP_RESTARTS,
    PodFailure,
    degraded_condition,
    pod_failure,
    pool_failures,
)
from genpool_operator.spec import GenPoolSpecError
from genpool_operator.spec_check import checked_spec, spec_error

EXAMPLES = Path(__file__).parents[3] / "examples"
BAD_CONFIG = "invalid worker configuration: tensor_parallel_size=2 must divide 3 KV heads\nmore"


def worker(
    name: str = "demo-0",
    *,
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    ready: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    status = {
        "name": "worker",
        "ready": ready,
        "restartCount": restarts,
        "state": state or {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        "lastState": {"terminated": last} if last else {},
    }
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [status]}}


def exited(code: int, message: str | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    if message is not None:
        term["message"] = message
    return term


CRASH_LOOP = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}}


def test_a_crash_loop_quotes_the_termination_messages_first_line() -> None:
    failure = pod_failure(worker(state=CRASH_LOOP, last=exited(2, BAD_CONFIG), restarts=1))
    assert failure == PodFailure(
        "demo-0",
        "worker",
        "WorkerCrashLoop",
        "invalid worker configuration: tensor_parallel_size=2 must divide 3 KV heads",
    )
    condition = degraded_condition(None, [failure])
    assert (condition.status, condition.reason) == (True, "WorkerCrashLoop")
    assert condition.message == f"pod demo-0: {BAD_CONFIG.splitlines()[0]}"


def test_an_oom_kill_says_so_not_the_logs_first_line() -> None:
    killed = {"exitCode": 137, "reason": "OOMKilled", "message": "INFO loading SmolLM2\n..."}
    failure = pod_failure(worker(state=CRASH_LOOP, last=killed, restarts=1))
    assert failure is not None and failure.reason == "WorkerCrashLoop"
    assert failure.cause.startswith("OOMKilled: over its memory limit (exit code 137)")


def test_a_pod_no_node_can_take_quotes_the_scheduler() -> None:
    pending = {
        "metadata": {"name": "demo-1"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/1 nodes are available: 1 Insufficient cpu.\nmore"}],
        },
    }  # fmt: skip
    assert pod_failure(pending) == PodFailure(
        "demo-1",
        "",
        "WorkerUnschedulable",
        "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu.",
    )
    waiting_for_a_node = {"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}
    pending["status"]["conditions"] = [waiting_for_a_node]  # type: ignore[index]
    assert pod_failure(pending) is None


def test_without_a_message_the_exit_code_is_the_cause() -> None:
    failure = pod_failure(worker(state=CRASH_LOOP, last=exited(137)))
    assert failure is not None and failure.cause == "exit code 137 (Error)"


def test_a_restarted_worker_still_loading_keeps_the_crash_loop_only_after_repeats() -> None:
    once = worker(last=exited(1, "model load failed"), restarts=1)
    assert pod_failure(once) is None  # one crash, now starting again: not yet a loop
    again = worker(last=exited(1, "model load failed"), restarts=MIN_CRASH_LOOP_RESTARTS)
    failure = pod_failure(again)
    assert failure is not None and failure.cause == "model load failed"


def test_ready_leaving_and_healthy_workers_are_not_failures() -> None:
    recovered = worker(last=exited(1, "oom"), restarts=5, ready=True)
    draining = worker(state={"terminated": exited(143)}, deleting=True)
    starting = worker(state={"waiting": {"reason": "ContainerCreating"}})
    clean_exit = worker(state={"waiting": {"reason": "PodInitializing"}}, last=exited(0))
    assert pool_failures([recovered, draining, starting, clean_exit, {}]) == []


def test_a_container_that_cannot_start_says_why() -> None:
    waiting = {"reason": "CreateContainerConfigError", "message": 'configmap "demo" not found'}
    failure = pod_failure(worker(state={"waiting": waiting}))
    assert failure is not None and failure.reason == "WorkerCannotStart"
    assert failure.cause == 'CreateContainerConfigError: configmap "demo" not found'


def test_a_stopped_failed_container_and_init_containers_count() -> None:
    stopped = worker(state={"terminated": exited(1, "engine failed: boom")})
    assert pod_failure(stopped) is not None
    init = worker(ready=True)
    init["status"]["initContainerStatuses"] = [
        {
            "name": "fetch",
            "ready": False,
            "state": CRASH_LOOP,
            "lastState": {"terminated": exited(1)},
        }
    ]
    failure = pod_failure(init)
    assert failure is not None and failure.container == "fetch"


def test_the_first_failing_pod_by_name_and_how_many_more() -> None:
    pods = [worker(f"demo-{i}", state=CRASH_LOOP, last=exited(1, f"cause {i}")) for i in (2, 0, 1)]
    condition = degraded_condition(None, pool_failures(pods))
    assert condition.message == "pod demo-0: cause 0 (and 2 more failing pods)"


def test_an_invalid_spec_wins_and_no_failure_means_not_degraded() -> None:
    failing = pool_failures([worker(state=CRASH_LOOP, last=exited(1, "x"))])
    invalid = degraded_condition("invalid spec: spec.replicas: too many", failing)
    assert (invalid.status, invalid.reason) == (True, "InvalidSpec")
    healthy = degraded_condition(None, [])
    assert (healthy.status, healthy.reason) == (False, "SpecApplied")


def test_tensor_parallel_size_that_cannot_shard_a_known_model_is_an_invalid_spec() -> None:
    raw = {"model": "smollm2-135m", "accelerator": "none", "tensorParallelSize": 2}
    with pytest.raises(GenPoolSpecError, match=r"spec\.tensorParallelSize: 2 .* 3 KV heads"):
        checked_spec(raw)
    message = spec_error(raw)
    assert message is not None and message.startswith("invalid spec: spec.tensorParallelSize: 2")
    assert spec_error({**raw, "tensorParallelSize": 3}) is None
    assert spec_error({**raw, "model": "synthetic:tiny"}) is None  # unknown: the worker checks


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_pass_the_operators_spec_check(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "GenPool":
            assert spec_error(doc["spec"]) is None
