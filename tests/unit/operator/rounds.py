"""Shared by the stats-round tests: the fake worker's stat line, a round run against a
status dict, and the merge patch that carries the controller's state from one round to
the next (as the operator does through the apiserver)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from bench.fake_workers import STATLINE
from genpool_core import ttft_histogram
from genpool_core.statline import StatLine, parse_statline
from genpool_operator.round_plan import PushOutcome, RoundPlan, plan_round, status_patch
from genpool_operator.spec import GenPoolSpec

# The fake line proposes raise-cap-budget-unspent (below-T 0.115 under eps - dead band,
# the cap turned over, a waiter at risk); a second round in a row confirms it.
PENDING_RAISE = {
    "residentHeadroom": 6,
    "pausedCap": 6,
    "pendingReason": "raise-cap-budget-unspent",
    "pendingRounds": 1,
}


def fake_line(t: float) -> StatLine:
    line = parse_statline(STATLINE.format(t=t))
    assert line is not None
    return line


LINE = fake_line(30.0)


def apply_patch(status: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """What the apiserver's merge patch does to these fields: each top-level key is
    replaced, ``None`` deletes it; through JSON, as the apiserver stores it."""
    merged = dict(status)
    for key, value in json.loads(json.dumps(patch)).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


AUTO: dict[str, Any] = {
    "replicas": 1,
    "engine": {"maxBatchSize": 8},
    "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 20},
    "slo": {"ttftP90Seconds": 1.0, "attainment": 0.8},
    "tuning": {"intervalSeconds": 10},
    "autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 3,
        "scaleDownStabilizationSeconds": 20, "maxStep": 2,
    },
}  # fmt: skip
ONE = PushOutcome(1, 1)


def auto_spec(**overrides: Any) -> GenPoolSpec:
    return GenPoolSpec.from_body({**AUTO, **overrides})


def autoscaling_spec(**overrides: Any) -> GenPoolSpec:
    return auto_spec(autoscaling={**AUTO["autoscaling"], **overrides})


def hist(seconds: float, n: int) -> tuple[int, ...]:
    counts = [0] * ttft_histogram.NUM_BUCKETS
    counts[ttft_histogram.bucket_of(seconds)] = n
    return tuple(counts)


def statline(t: float, **overrides: Any) -> StatLine:
    """One worker's 10 s window: 5 req/s of 0.6 batch position-seconds each (3 of its 8
    positions), TTFT well inside 1 s, pausing able to admit two more."""
    base = StatLine(
        t=t, mode="target_output_tps", residents=4, active=4, paused=0, cap=2, headroom=2,
        waiters=0, completed_window=50, slo_completed_window=50, below_target_window=0.05,
        arrivals_window=50, arrivals_total=500, steps_window=500, batch_mean=4.0,
        ttft_hist=hist(0.1, 50), batch_seconds=30.0, pause_budget=2,
    )  # fmt: skip
    return replace(base, **overrides)


# 20 req/s into one worker, its batch full, a queue pausing cannot admit, TTFT missed
OVERLOAD: dict[str, Any] = {
    "waiters": 30,
    "arrivals_window": 200,
    "completed_window": 100,
    "slo_completed_window": 100,
    "batch_mean": 8.0,
    "batch_seconds": 80.0,
    "pause_budget": 0,
    "ttft_hist": hist(4.0, 60),
}
QUIET: dict[str, Any] = {"batch_mean": 0.5, "arrivals_window": 20, "completed_window": 20,
                         "slo_completed_window": 20, "batch_seconds": 12.0}  # fmt: skip


def pods(num: int, t: float, **overrides: Any) -> dict[str, Sequence[StatLine]]:
    return {f"pod-{i}": [statline(t, **overrides)] for i in range(num)}


def run_round(
    spec: GenPoolSpec,
    status: Mapping[str, Any],
    lines: Mapping[str, Sequence[StatLine]],
    now: float,
    *,
    num_ready: int | None = None,
    is_deciding: bool = True,
) -> tuple[RoundPlan, dict[str, Any]]:
    """One round: its plan and the status after its patch (what a restart reads back)."""
    ready = len(lines) if num_ready is None else num_ready
    plan = plan_round(spec, status, lines, now=now, num_ready=ready, is_deciding=is_deciding)
    push = PushOutcome(ready, ready)
    patch = status_patch(spec, plan, push, status, observed_generation=1, now_text=f"T{now:g}")
    return plan, apply_patch(status, patch)


def run_rounds(
    spec: GenPoolSpec, status: Mapping[str, Any], times: Sequence[float], num: int, **line: Any
) -> tuple[list[tuple[int, str]], dict[str, Any]]:
    """Deciding rounds at ``times``, each with a new window from ``num`` pods."""
    seen = []
    current = dict(status)
    for i, now in enumerate(times):
        plan, current = run_round(spec, current, pods(num, 30.0 + 10 * i, **line), now)
        scaling = plan.decision.scaling
        assert scaling is not None
        seen.append((plan.decision.desired, scaling.reason))
    return seen, current
