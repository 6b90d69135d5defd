"""One stats round for one pool: scrape, aggregate, tune, push, record (docs/design.md#operator).

The kopf daemon in ``handlers`` calls :func:`run_round` every
``tuning.intervalSeconds``; the reconcile handler calls :func:`run_round` with ``tune=False`` right
after a spec change so live fields reach the pods without waiting for the next round.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from genpool_core import tuner
from genpool_core.aggregate import PoolStats, aggregate
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.statline import StatLine
from genpool_operator.conditions import Condition, merge_conditions
from genpool_operator.kube import Kube, resource_path
from genpool_operator.scrape import (
    PodTarget,
    WorkerClient,
    in_sync,
    ready_targets,
    statline_from_log,
)
from genpool_operator.spec import GenPoolSpec
from genpool_operator.status import now_iso, update_status

log = logging.getLogger("genpool.operator.stats")
HISTORY_LIMIT = 10
STALE_INTERVALS = 2


@dataclass
class PoolMemory:
    """What the operator remembers about one pool between rounds (not persisted:
    after a restart the first round simply counts as fresh)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_t: dict[str, float] = field(default_factory=dict)
    last_advance: dict[str, float] = field(default_factory=dict)
    started_at: float | None = None


@dataclass(frozen=True)
class RoundResult:
    stats: PoolStats | None
    stale: bool
    decision: tuner.Decision | None
    live: dict[str, Any]
    generation: int
    in_sync: int
    targets: int
    push_errors: dict[str, str]
    knobs_before: Knobs

    def change_text(self) -> str:
        """``raise-cap-budget-unspent: headroom 1 -> 2, cap 1 -> 2`` for Events."""
        decision, before = self.decision, self.knobs_before
        if decision is None:
            return ""
        after = decision.knobs
        return (
            f"{decision.reason}: headroom {before.resident_headroom} -> "
            f"{after.resident_headroom}, cap {before.paused_cap} -> {after.paused_cap}"
        )


def knobs_in_force(spec: GenPoolSpec, tuning_status: dict[str, Any]) -> Knobs:
    """The tuner's last knobs (status survives restarts), else the spec's start values,
    clamped into the spec's current bounds."""
    start = spec.start_knobs()
    if not spec.preemption_on:
        return start
    return spec.bounds().clamp(Knobs.from_json(tuning_status, start))


def live_config(spec: GenPoolSpec, knobs: Knobs) -> dict[str, Any]:
    return {
        "resident_headroom": knobs.resident_headroom,
        "paused_cap": knobs.paused_cap,
        **spec.live_config(),
    }


def desired_generation(tuning_status: dict[str, Any], live: dict[str, Any]) -> int:
    """A new config generation whenever the live values change; workers refuse older ones."""
    generation = int(tuning_status.get("appliedGeneration", 0))
    return generation if tuning_status.get("liveConfig") == live else generation + 1


def freshness(
    memory: PoolMemory, lines: dict[str, StatLine], now: float, interval: float
) -> tuple[bool, bool]:
    """(stale, advanced): stale when no pod's line moved for two intervals; advanced
    when some pod has a line the tuner has not seen (so it never counts one twice)."""
    advanced = False
    for pod, line in lines.items():
        if memory.last_t.get(pod) != line.t:
            memory.last_t[pod] = line.t
            memory.last_advance[pod] = now
            advanced = True
    if memory.started_at is None:
        memory.started_at = now
    newest = max((memory.last_advance.get(pod, 0.0) for pod in lines), default=None)
    if newest is None:
        # Nothing reports: stale once we have waited long enough to expect a line.
        return now - memory.started_at > STALE_INTERVALS * interval, False
    return now - newest > STALE_INTERVALS * interval, advanced


async def read_lines(
    workers: WorkerClient, kube: Kube, spec: GenPoolSpec, namespace: str, targets: list[PodTarget]
) -> dict[str, StatLine]:
    if spec.tuning.stats_source == "Log":

        async def from_log(target: PodTarget) -> StatLine | None:
            return await statline_from_log(kube, namespace, target.name)

        lines = await workers.gather(from_log, targets)
    else:
        lines = await workers.gather(workers.statline, targets)
    return {t.name: line for t, line in zip(targets, lines, strict=True) if line is not None}


async def push_live(
    workers: WorkerClient, targets: list[PodTarget], generation: int, live: dict[str, Any]
) -> tuple[int, dict[str, str]]:
    """Push to every pod not yet in sync; returns (pods in sync, errors by pod)."""
    configs = await workers.gather(workers.config, targets)
    stale = [t for t, c in zip(targets, configs, strict=True) if not in_sync(c, generation, live)]
    results = await workers.gather(lambda t: workers.put_config(t, generation, live), stale)
    errors = {t.name: err for t, err in zip(stale, results, strict=True) if err is not None}
    return len(targets) - len(errors), errors


async def list_targets(kube: Kube, namespace: str, name: str) -> list[PodTarget]:
    pods = await kube.list(
        resource_path("v1", "Pod", namespace), label_selector=f"genpool.dev/pool={name}"
    )
    return ready_targets(pods)


def tuning_record(
    tuning_status: dict[str, Any], result: RoundResult, now_text: str
) -> dict[str, Any]:
    """``status.tuning`` after a round: knobs, sync, tuner state, bounded history."""
    decision, knobs_before = result.decision, result.knobs_before
    record = dict(tuning_status)
    knobs = decision.knobs if decision else knobs_before
    record.update(
        residentHeadroom=knobs.resident_headroom,
        pausedCap=knobs.paused_cap,
        appliedGeneration=result.generation,
        liveConfig=result.live,
        podsInSync=f"{result.in_sync}/{result.targets}",
    )
    if decision is not None:
        record.update(decision.state.to_status())
        record["lastReason"] = decision.reason
    if decision is not None and decision.changed:
        change = {
            "time": now_text,
            "reason": decision.reason,
            "from": _knobs_dict(knobs_before),
            "to": _knobs_dict(decision.knobs),
        }
        record["lastChange"] = change
        record["history"] = [*list(tuning_status.get("history") or []), change][-HISTORY_LIMIT:]
    return record


def _knobs_dict(knobs: Knobs) -> dict[str, int]:
    return {"residentHeadroom": knobs.resident_headroom, "pausedCap": knobs.paused_cap}


def round_conditions(result: RoundResult, bounds: KnobBounds, knobs: Knobs) -> list[Condition]:
    at_bound = knobs.resident_headroom >= bounds.max_resident_headroom
    synced = result.in_sync == result.targets
    return [
        Condition(
            "StatsStale",
            result.stale,
            "NoFreshStatLines" if result.stale else "StatLinesFresh",
            f"{result.stats.workers_reporting if result.stats else 0} workers reporting",
        ),
        Condition(
            "TuningInSync",
            synced,
            "AllPodsInSync" if synced else "PodsOutOfSync",
            "; ".join(f"{p}: {e}" for p, e in sorted(result.push_errors.items()))
            or f"{result.in_sync}/{result.targets} pods at generation {result.generation}",
        ),
        Condition(
            "HeadroomAtBound",
            at_bound,
            "HeadroomAtMax" if at_bound else "HeadroomBelowMax",
            f"headroom {knobs.resident_headroom} of max {bounds.max_resident_headroom}",
        ),
    ]


async def run_round(
    kube: Kube,
    workers: WorkerClient,
    body: dict[str, Any],
    memory: PoolMemory,
    *,
    now: float,
    tune: bool = True,
) -> RoundResult | None:
    """Scrape, tune and push for one pool; write status. ``None`` if the spec is invalid
    (the reconcile handler reports that)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        spec = GenPoolSpec.from_body(body.get("spec") or {})
    except ValueError:
        return None
    async with memory.lock:
        targets = await list_targets(kube, namespace, name)
        lines = await read_lines(workers, kube, spec, namespace, targets)
        stale, advanced = freshness(memory, lines, now, float(spec.tuning.interval_seconds))
        stats = aggregate(list(lines.values()))
        result = await _decide_and_push(
            kube,
            workers,
            body,
            spec,
            targets,
            stats,
            stale=stale,
            tune_now=tune and (stale or advanced),
        )
    return result


async def _decide_and_push(
    kube: Kube,
    workers: WorkerClient,
    body: dict[str, Any],
    spec: GenPoolSpec,
    targets: list[PodTarget],
    stats: PoolStats | None,
    *,
    stale: bool,
    tune_now: bool,
) -> RoundResult:
    meta = body["metadata"]
    tuning_status = dict((body.get("status") or {}).get("tuning") or {})
    before = knobs_in_force(spec, tuning_status)
    bounds = spec.bounds()
    decision = None
    if tune_now and spec.tuning.enabled and spec.preemption.mode != "Off":
        state = tuner.TunerState.from_status(tuning_status)
        settings = tuner.TunerSettings(cooldown_intervals=spec.tuning.cooldown_intervals)
        decision = tuner.tune(before, bounds, stats, state, settings, stale=stale)
    knobs = decision.knobs if decision else before
    live = live_config(spec, knobs)
    generation = desired_generation(tuning_status, live)
    synced, errors = await push_live(workers, targets, generation, live)
    result = RoundResult(
        stats, stale, decision, live, generation, synced, len(targets), errors, before
    )
    stamp = now_iso()

    def mutate(status: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
        patch: dict[str, Any] = {
            "tuning": tuning_record(dict(status.get("tuning") or {}), result, stamp),
            "workersReporting": stats.workers_reporting if stats else 0,
            "conditions": merge_conditions(
                status.get("conditions"),
                round_conditions(result, bounds, knobs),
                now_iso=stamp,
                observed_generation=fresh["metadata"].get("generation"),
            ),
        }
        if stats is not None and not stale:
            patch["preemption"] = stats.to_status()
            patch["statsUpdatedAt"] = stamp
        return patch

    await update_status(kube, meta["namespace"], meta["name"], mutate)
    return result
