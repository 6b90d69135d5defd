"""Ready / Progressing from the StatefulSet's counts, and a rollout stalled by failing workers."""

from __future__ import annotations

from genpool_operator.conditions import readiness_conditions


def _by_type(desired: int, ready: int, updated: int, degraded: bool) -> dict[str, tuple[bool, str]]:
    conditions = readiness_conditions(desired, ready, updated, degraded=degraded)
    return {c.type: (c.status, c.reason) for c in conditions}


def test_a_rollout_progresses_until_every_replica_is_ready() -> None:
    assert _by_type(2, 1, 2, False)["Progressing"] == (True, "RollingOut")
    assert _by_type(2, 2, 2, False) == {
        "Ready": (True, "AllReplicasReady"),
        "Progressing": (False, "Stable"),
    }


def test_failing_workers_stall_the_rollout_instead_of_progressing_forever() -> None:
    # The crash-looping TP example: 0/1 ready, Degraded=True. Progressing=True forever
    # would tell a user (and `kubectl wait`) to keep waiting.
    conditions = _by_type(1, 0, 1, True)
    assert conditions["Progressing"] == (False, "WorkersFailing")
    assert conditions["Ready"] == (False, "ReplicasNotReady")


def test_a_degraded_pool_with_every_replica_ready_is_not_stalled() -> None:
    assert _by_type(2, 2, 2, True)["Progressing"] == (False, "Stable")
