"""A replica time-table for the simulator: the ``oracle`` policy (and the ``static``
one, a table of one entry).

The oracle knows the load's phases: each phase's replicas are started the start-up
delay before it begins, so they serve from its first second, and the extra ones drain
when it ends. Its cost counts the start-up (replica-seconds count from the moment a
replica is added). ``bench/autoscale_study.py`` finds the cheapest table that meets the
SLO by sweeping each rate's count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from genpool_sim.cluster import Cluster


class SchedulePool:
    """Replicas by time: ``schedule`` is (phase start, replicas) in order, the first
    at 0; the pool starts with the first entry's count."""

    interval_s = 1e9  # no rounds: the table's changes are events of their own

    def __init__(self, schedule: Sequence[tuple[float, int]], startup_delay_s: float) -> None:
        if not schedule or schedule[0][0] != 0 or any(n < 1 for _, n in schedule):
            raise ValueError("a schedule starts at 0 s with at least one replica per entry")
        starts = [t for t, _ in schedule]
        if starts != sorted(starts):
            raise ValueError("a schedule's entries are in time order")
        self.schedule = tuple(schedule)
        self.startup_delay_s = startup_delay_s
        self.timeline: list[dict[str, object]] = []

    @property
    def start_replicas(self) -> int:
        return self.schedule[0][1]

    def attach(self, cluster: Cluster) -> None:
        self.timeline.append({"t": 0.0, "desired": self.start_replicas,
                              "ready": len(cluster.workers), "reason": "start",
                              "ttft_p90": None})  # fmt: skip
        previous = self.start_replicas
        for start, replicas in self.schedule[1:]:
            # more: added early enough to serve from the phase's first second; fewer:
            # the extra ones drain when the phase begins
            at = max(0.0, start - self.startup_delay_s) if replicas > previous else start
            cluster.at(at, self._change(cluster, replicas, start), order=1)
            previous = replicas

    def _change(self, cluster: Cluster, replicas: int, start: float) -> Callable[[float], None]:
        def act(now: float) -> None:
            cluster.scale_to(replicas, max(0.0, start - now))
            self.timeline.append({"t": now, "desired": replicas, "ready": None,
                                  "reason": "schedule", "ttft_p90": None})  # fmt: skip

        return act

    def tick(self, cluster: Cluster, now: float) -> None:
        return None
