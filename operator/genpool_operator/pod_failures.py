"""Why a GenPool cannot run, from its spec check and its pods' container statuses (pure).

One function, :func:`degraded_condition`, decides the ``Degraded`` condition for both
writers: the reconcile handler (after applying the children) and the pod watch (after
a worker's status changes), so neither overwrites the other's finding.

A worker pod is failing when no node can take it (the scheduler says Unschedulable: its
message is the cause), and a worker container when it cannot start (a configuration or
image error) or crash-loops: it waits in ``CrashLoopBackOff``, has stopped for good with
a non-zero exit, or runs again after at least :data:`MIN_CRASH_LOOP_RESTARTS` restarts
without being ready yet. The cause is the first line of the termination message the
kubelet recorded for the last exit (the worker writes its fatal error there; with
``FallbackToLogsOnError`` it is the log's tail otherwise; an OOM kill says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from genpool_core.termination import first_line
from genpool_operator.conditions import Condition

DEGRADED = "Degraded"
# A running container that has restarted this often since its last ready state is
# still crash-looping between back-offs: Degraded stays True instead of flapping.
MIN_CRASH_LOOP_RESTARTS = 2
# Waiting reasons that mean the container cannot start until something changes.
CANNOT_START_REASONS = frozenset({
    "CreateContainerConfigError",
    "CreateContainerError",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "RunContainerError",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class PodFailure:
    pod: str
    container: str
    reason: str  # WorkerCrashLoop | WorkerCannotStart | WorkerUnschedulable
    cause: str  # one line: the termination message's first line, or what the kubelet said


def pod_failure(pod: dict[str, Any]) -> PodFailure | None:
    """The first failing container of ``pod``, or None. A pod being deleted is leaving
    (a drain, a scale-down, a rollout): how it exits is no failure of the pool."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    name = str(meta.get("name", ""))
    unschedulable = _unschedulable(status)
    if unschedulable is not None:
        return PodFailure(name, "", "WorkerUnschedulable", unschedulable)
    containers = (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    )
    for container in containers:
        found = _container_failure(container)
        if found is not None:
            reason, cause = found
            return PodFailure(name, str(container.get("name", "")), reason, cause)
    return None


def _unschedulable(status: dict[str, Any]) -> str | None:
    """The scheduler's word when no node can take the pod (too little CPU or memory, a
    selector or taint nothing matches), or None."""
    for condition in status.get("conditions") or []:
        if (condition.get("type"), condition.get("status")) != ("PodScheduled", "False"):
            continue
        if condition.get("reason") == "Unschedulable":
            message = first_line(str(condition.get("message") or ""))
            return f"Unschedulable: {message}" if message else "Unschedulable"
    return None


def pool_failures(pods: Iterable[dict[str, Any]]) -> list[PodFailure]:
    """Every failing pod's first failure, by pod name."""
    failures = [f for f in map(pod_failure, pods) if f is not None]
    return sorted(failures, key=lambda f: f.pod)


def degraded_condition(spec_error: str | None, failures: list[PodFailure]) -> Condition:
    """Degraded: an invalid spec first (nothing runs until it is fixed), then failing
    workers (the first by pod name, and how many more), else False."""
    if spec_error is not None:
        return Condition(DEGRADED, True, "InvalidSpec", spec_error)
    if failures:
        first = failures[0]
        message = f"pod {first.pod}: {first.cause}"
        if len(failures) > 1:
            message += f" (and {len(failures) - 1} more failing pods)"
        return Condition(DEGRADED, True, first.reason, message)
    return Condition(DEGRADED, False, "SpecApplied", "children applied, no worker failing")


def _container_failure(container: dict[str, Any]) -> tuple[str, str] | None:
    if container.get("ready"):
        return None
    state = container.get("state") or {}
    waiting = state.get("waiting") or {}
    last = (container.get("lastState") or {}).get("terminated")
    stopped = state.get("terminated")
    if waiting.get("reason") in CANNOT_START_REASONS:
        return "WorkerCannotStart", _waiting_cause(waiting)
    if stopped and stopped.get("exitCode") != 0:
        return "WorkerCrashLoop", _exit_cause(stopped)
    if waiting.get("reason") == "CrashLoopBackOff":
        return "WorkerCrashLoop", _exit_cause(last) if last else _waiting_cause(waiting)
    restarts = int(container.get("restartCount") or 0)
    if (
        "running" in state
        and last
        and last.get("exitCode") != 0
        and restarts >= MIN_CRASH_LOOP_RESTARTS
    ):
        return "WorkerCrashLoop", _exit_cause(last)
    return None


def _exit_cause(terminated: dict[str, Any]) -> str:
    code, reason = terminated.get("exitCode"), terminated.get("reason") or "Error"
    if reason == "OOMKilled":
        # The kernel killed it: the message is only the log's tail (FallbackToLogsOnError),
        # whose first line says nothing about memory.
        return f"OOMKilled: over its memory limit (exit code {code}); raise resources.limits"
    return first_line(str(terminated.get("message") or "")) or f"exit code {code} ({reason})"


def _waiting_cause(waiting: dict[str, Any]) -> str:
    reason = str(waiting.get("reason") or "Waiting")
    message = first_line(str(waiting.get("message") or ""))
    return f"{reason}: {message}" if message else reason
