"""The operator's pool controller in the simulator's loop (``genpool sim --tune``,
``--autoscale``).

Every ``interval_s`` simulated seconds :class:`SimPool` does what the operator does for
a real pool: each serving worker's stat line for the window since it was last read (the
worker's own ``make_statline``, formatted and parsed back, so the controller sees
exactly the operator's numbers), then :func:`genpool_core.controller.run_round`, the
same function the operator runs, with its state in memory. The new knobs go to every
worker's scheduler through ``set_knobs`` (the call ``PUT /config`` makes) and the
desired replicas are added (serving after the start-up delay) or drained.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Protocol

from genpool_core.controller import (
    ControllerSettings,
    ControllerState,
    Observation,
    RoundDecision,
    knobs_in_force,
    run_round,
)
from genpool_core.field_help import DESCRIPTION
from genpool_core.knobs import KnobBounds
from genpool_core.scaler import ScalerSettings, ScalerState
from genpool_core.scaler_estimates import Estimates
from genpool_core.statline import StatLine, format_statline, make_statline, parse_statline
from genpool_core.stats import SchedulerStats
from genpool_core.tuner import TunerSettings
from genpool_sim.cluster import Cluster
from genpool_sim.replica import GenWorker


class PoolDriver(Protocol):
    """What runs a simulated pool's replicas: rounds every ``interval_s`` (``tick``)."""

    interval_s: float
    timeline: list[dict[str, object]]

    def attach(self, cluster: Cluster) -> None: ...

    def tick(self, cluster: Cluster, now: float) -> None: ...


class PoolReader:
    """Each serving worker's window since its last read, as the operator reads it."""

    def __init__(self) -> None:
        self._previous: dict[int, SchedulerStats] = {}

    def read(self, cluster: Cluster, now: float) -> dict[str, list[StatLine]]:
        lines = {}
        for worker in cluster.serving_workers():
            stats = worker.scheduler.make_stats(now)
            line = make_statline(stats, self._previous.get(worker.index))
            self._previous[worker.index] = stats
            parsed = parse_statline(format_statline(line))
            if parsed is not None:
                lines[str(worker.index)] = [parsed]
        return lines


@dataclass(frozen=True)
class TuneConfig:
    """The knob tuner's part of the controller (``spec.tuning``)."""

    bounds: KnobBounds = field(
        metadata={
            DESCRIPTION: "the range the tuner may move H and P in, requests per worker"
            " (spec.tuning's residentHeadroom and pausedCap)"
        }
    )
    interval_s: float = field(
        default=30.0,
        metadata={
            DESCRIPTION: "simulated seconds between tuner rounds, each on the stat lines of"
            " the window since the last"
        },
    )
    settings: TunerSettings = field(
        default_factory=TunerSettings,
        metadata={DESCRIPTION: "the tuner's thresholds, steps, hysteresis and cooldown"},
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"tuner interval must be > 0 s, got {self.interval_s}")


class SimPool:
    """One per simulated pool: the controller's state, the decision log (``records``,
    the tuner's turns) and the replica log (``timeline``) for JSON and plots."""

    def __init__(
        self,
        interval_s: float,
        tune: TuneConfig | None = None,
        scaler: ScalerSettings | None = None,
        startup_delay_s: float = 0.0,
        learned: Estimates | None = None,
    ) -> None:
        if tune is not None and tune.interval_s != interval_s:
            raise ValueError(f"one round interval: tuner {tune.interval_s} s vs {interval_s} s")
        self.interval_s = interval_s
        self.tune = tune
        self.scaler = scaler
        self.startup_delay_s = startup_delay_s
        self.settings: ControllerSettings | None = None
        # a pool that ran before starts from what its scaler learned (status.scaling.state)
        self.state = ControllerState(
            scaler=ScalerState(estimates=learned) if learned is not None else ScalerState()
        )
        self.records: list[dict[str, object]] = []
        self.timeline: list[dict[str, object]] = []
        self._reader = PoolReader()

    def attach(self, cluster: Cluster) -> None:
        """Settings from the cluster as started (its knobs are the spec's start knobs)."""
        start = cluster.workers[0].scheduler.knobs
        is_pausing = cluster.config.kind.is_pausing
        bounds = self.tune.bounds if self.tune else KnobBounds(0, 0, 0, 0)
        self.settings = ControllerSettings(
            interval_s=self.interval_s,
            start_replicas=len(cluster.workers),
            bounds=bounds,
            start_knobs=start,
            is_pausing=is_pausing and self.tune is not None,
            tuner=self.tune.settings if self.tune else None,
            scaler=self.scaler,
        )
        cluster.on_ready = self._configure  # a replica that starts later gets the knobs too
        if knobs_in_force(self.settings, self.state) != start:
            self._push(cluster)
        self.timeline.append({"t": 0.0, "desired": len(cluster.workers),
                              "ready": len(cluster.workers), "reason": "start",
                              "ttft_p90": None})  # fmt: skip

    def tick(self, cluster: Cluster, now: float) -> None:
        assert self.settings is not None, "attach() first"
        num_ready = sum(1 for worker in cluster.workers if worker.is_routable)
        seen = Observation(self._reader.read(cluster, now), num_ready)
        decision = run_round(self.settings, self.state, seen, now=now)
        self.state = decision.state
        if decision.knobs != decision.knobs_before:
            self._push(cluster)
        if decision.scaling is not None:
            cluster.scale_to(decision.desired, self.startup_delay_s)
        self._record(decision, now, num_ready)

    def _record(self, decision: RoundDecision, now: float, num_ready: int) -> None:
        stats, tuning, scaling = decision.stats, decision.tuning, decision.scaling
        if tuning is not None:
            before, after = decision.knobs_before, tuning.knobs
            self.records.append({
                "t": round(now, 3), "reason": tuning.reason, "changed": tuning.changed,
                "headroom": after.resident_headroom, "cap": after.paused_cap,
                "from": [before.resident_headroom, before.paused_cap],
                "stats": None if stats is None else stats.to_status(),
            })  # fmt: skip
        p90 = None if stats is None else stats.ttft_p90
        inputs = None if scaling is None or scaling.inputs is None else scaling.inputs
        self.timeline.append({
            "t": now, "desired": decision.desired, "ready": num_ready,
            "reason": scaling.reason if scaling is not None else "static",
            "ttft_p90": None if p90 is None else round(p90, 4),
            "inputs": None if inputs is None else _rounded(asdict(inputs)),
        })  # fmt: skip

    def _push(self, cluster: Cluster) -> None:
        for worker in cluster.serving_workers():
            self._configure(worker)

    def _configure(self, worker: GenWorker) -> None:
        assert self.settings is not None
        if self.settings.is_pausing:
            worker.scheduler.set_knobs(knobs_in_force(self.settings, self.state))

    @property
    def num_changes(self) -> int:
        return sum(1 for record in self.records if record["changed"])


def _rounded(values: dict[str, object]) -> dict[str, object]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in values.items()}
