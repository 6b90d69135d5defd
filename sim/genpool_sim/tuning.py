"""The operator's tuner in the simulator's loop (``genpool sim --tune``) and the
phased closed-loop workload it is evaluated on.

Every ``interval_s`` simulated seconds :class:`SimTuner` does what the operator does
for a real pool: one stat line per worker (the worker's own ``make_statline``,
formatted and parsed back, so the tuner sees exactly the operator's numbers),
``aggregate``, ``tune``, then the new knobs go to every worker's scheduler through
``set_knobs`` (the same call ``PUT /config`` makes). Pure and seeded like the rest
of the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from genpool_core.aggregate import PoolStats, aggregate
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.statline import format_statline, make_statline, parse_statline
from genpool_core.stats import SchedulerStats
from genpool_core.tuner import TunerSettings, TunerState, tune
from genpool_sim.cluster import Cluster
from genpool_sim.replica import GenWorker


class PoolReader:
    """Reads a simulated pool's stat lines as the operator does: one window per worker since
    its last read, formatted and parsed back, then aggregated."""

    def __init__(self) -> None:
        self._previous: dict[int, SchedulerStats] = {}

    def read(self, cluster: Cluster, now: float) -> PoolStats | None:
        lines = []
        for worker in cluster.serving_workers():
            stats = worker.scheduler.make_stats(now)
            line = make_statline(stats, self._previous.get(worker.index))
            self._previous[worker.index] = stats
            lines.append(parse_statline(format_statline(line)))
        return aggregate(lines)


@dataclass(frozen=True)
class TuneConfig:
    bounds: KnobBounds
    interval_s: float = 30.0
    settings: TunerSettings = field(default_factory=TunerSettings)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"tuner interval must be > 0 s, got {self.interval_s}")


class SimTuner:
    """One per simulated pool; ``records`` is the decision log for the JSON output."""

    def __init__(self, config: TuneConfig) -> None:
        self.config = config
        self.state = TunerState()
        self.knobs: Knobs | None = None
        self.records: list[dict[str, object]] = []
        self._reader = PoolReader()

    def attach(self, cluster: Cluster) -> None:
        """Start-up knobs clamped into the bounds, as the operator writes worker.json."""
        scheduler = cluster.workers[0].scheduler
        start = scheduler.knobs
        self.knobs = self.config.bounds.clamp(start)
        cluster.on_ready = self._configure  # a replica that starts later gets the knobs too
        if self.knobs != start:
            self._push(cluster)

    def tick(self, cluster: Cluster, now: float) -> None:
        assert self.knobs is not None, "attach() first"
        pool = self._reader.read(cluster, now)
        before = self.knobs
        decision = tune(before, self.config.bounds, pool, self.state, self.config.settings,
                        stale=False)  # fmt: skip
        self.knobs, self.state = decision.knobs, decision.state
        if decision.changed:
            self._push(cluster)
        self.records.append({
            "t": round(now, 3), "reason": decision.reason, "changed": decision.changed,
            "headroom": decision.knobs.resident_headroom, "cap": decision.knobs.paused_cap,
            "from": [before.resident_headroom, before.paused_cap],
            "stats": None if pool is None else pool.to_status(),
        })  # fmt: skip

    def _push(self, cluster: Cluster) -> None:
        for worker in cluster.serving_workers():
            self._configure(worker)

    def _configure(self, worker: GenWorker) -> None:
        assert self.knobs is not None
        worker.scheduler.set_knobs(self.knobs)

    @property
    def num_changes(self) -> int:
        return sum(1 for record in self.records if record["changed"])


# -- phased closed loop ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phase:
    duration_s: float
    clients: int


def parse_phases(text: str) -> list[Phase]:
    """``"120:150,240:300,240:180"``: (seconds, closed-loop clients) per phase, in order."""
    phases = []
    for index, item in enumerate(text.split(","), start=1):
        duration, sep, clients = item.strip().partition(":")
        if not sep:
            raise ValueError(f"phase {index} {item!r}: expected SECONDS:CLIENTS")
        try:
            seconds, count = float(duration), int(clients)
        except ValueError:
            raise ValueError(
                f"phase {index} {item!r}: SECONDS is a number, CLIENTS an integer"
            ) from None
        if not (math.isfinite(seconds) and seconds > 0) or count < 0:
            raise ValueError(f"phase {index} {item!r}: need SECONDS > 0 and CLIENTS >= 0")
        phases.append(Phase(seconds, count))
    if not any(phase.clients for phase in phases):
        raise ValueError("phases: at least one phase needs clients")
    return phases


def phase_starts(phases: Sequence[Phase]) -> list[float]:
    starts, t = [], 0.0
    for phase in phases:
        starts.append(t)
        t += phase.duration_s
    return starts


def clients_at(phases: Sequence[Phase], t: float) -> int:
    """Clients allowed to send at ``t``; a phase owns its start instant; 0 after the end."""
    for start, phase in zip(phase_starts(phases), phases, strict=True):
        if start <= t < start + phase.duration_s:
            return phase.clients
    return 0
