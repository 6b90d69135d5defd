"""Pool-level statistics from the workers' stat lines (docs/design.md#stat-line, #operator).

Pure: the operator scrapes and parses, this module only adds up. Each worker's line
covers its own last window, so counters are summed and ratios are re-weighted by the
counts they were measured over (a worker that completed 3 requests must not weigh
as much as one that completed 300). Garbage (``None`` from ``parse_statline``) is
skipped, never fatal: one broken pod must not blind the tuner to the others.

Which ``PoolStats`` attribute comes from which line attribute, by which rule, over
which lines, and under which ``status.preemption`` key: the rows of
``genpool_core.stat_fields``; this module applies them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genpool_core import ttft_histogram
from genpool_core.stat_fields import (
    FIELDS,
    Kind,
    Over,
    Pool,
    Rule,
    StatField,
    Status,
    StatusGroup,
    Weight,
    pooled,
)
from genpool_core.statline import VICTIM_ORDER, StatLine

MIXED_MODE = "mixed"
_STATUS_VICTIM_KEYS = {
    "laxity": "laxity",
    "below_target": "belowTarget",
    "sacrificed": "sacrificed",
}


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Sums over the reporting workers, and ratios weighted by what they count."""

    workers_reporting: int  # pods with a line: the snapshot values sum over them
    mode: str
    paused: int
    paused_cap: int  # summed over the workers, as are the other counts
    resident_headroom: int
    waiters: int
    at_risk: int
    completed_window: int
    pauses_window: int
    laxity_resumes: int
    victims: Mapping[str, int] = field(default_factory=dict)
    below_target_window: float | None = None
    below_target_total: float | None = None
    credit_sum: float | None = None  # per-worker credit buckets: the pool's SLO budget
    mean_laxity: float | None = None
    paused_below_target: int | None = None
    admission_target_mean_s: float | None = None
    # the replica scaler's inputs: window sums, step-weighted batch, summed TTFT histogram
    arrivals_window: int = 0
    steps_window: int = 0
    batch_mean: float | None = None
    ttft_hist: tuple[int, ...] = ()
    slo_completed_window: int = 0  # the completions below_target_window is over
    batch_seconds: float | None = None  # decode position-seconds over the windows
    pause_budget: int | None = None  # at-risk waiters pausing could still admit; None: off
    # mean KV use of the reporting workers with a KV budget, and its paused share
    kv_used: float | None = None
    kv_paused: float | None = None
    # pod windows behind the window sums (a pod may add none or two); None: one per worker
    windows_counted: int | None = None

    @property
    def ttft_p90(self) -> float | None:
        return ttft_histogram.quantile(self.ttft_hist, 0.9)

    @property
    def num_windows(self) -> int:
        return self.workers_reporting if self.windows_counted is None else self.windows_counted

    @property
    def num_first_tokens(self) -> int:
        return sum(self.ttft_hist)

    @property
    def victims_window(self) -> int:
        return sum(self.victims.values())

    def victim_share(self, *kinds: str) -> float:
        """Fraction of this window's victims of the given kinds (0 when there were none)."""
        total = self.victims_window
        return sum(self.victims.get(k, 0) for k in kinds) / total if total else 0.0

    def to_status(self) -> dict[str, object]:
        """``status.preemption`` in the CRD's camelCase shape, JSON-safe (no NaN/inf)."""
        status: dict[str, object] = {}
        for row, pool, spelling in _STATUS_ROWS:
            value = getattr(self, pool.attr)
            if row.kind is Kind.VICTIMS:  # the counts by kind, and the line's text of them
                status[spelling.key] = {
                    name: value.get(kind, 0) for kind, name in _STATUS_VICTIM_KEYS.items()
                }
                status[spelling.key + "Text"] = victims_text(value)
            elif spelling.digits is not None:
                status[spelling.key] = _rounded(value, spelling.digits)
            else:
                status[spelling.key] = value
        return status


def victims_text(victims: Mapping[str, int]) -> str:
    """``laxity:40,below_target:10,sacrificed:7`` in the stat line's order; ``-`` if none."""
    known = [k for k in VICTIM_ORDER if victims.get(k)]
    other = sorted(k for k in victims if k not in VICTIM_ORDER and victims[k])
    return ",".join(f"{k}:{victims[k]}" for k in known + other) or "-"


def _rounded(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _weighted_mean(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    """Mean of the present values, weighted; ``None`` when nothing carries weight."""
    num = den = 0.0
    for value, weight in pairs:
        if value is not None and math.isfinite(value) and weight > 0:
            num += value * weight
            den += weight
    return num / den if den > 0 else None


def _present(values: Iterable[float | int | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _sum_victims(maps: Iterable[Mapping[str, int]]) -> dict[str, int]:
    victims: dict[str, int] = {}
    for counts in maps:
        for kind, count in counts.items():
            victims[kind] = victims.get(kind, 0) + count
    return victims


def _usable(lines: Iterable[StatLine | None]) -> list[StatLine]:
    return [line for line in lines if isinstance(line, StatLine) and math.isfinite(line.t)]


def aggregate(
    lines: Iterable[StatLine | None], windows: Iterable[StatLine | None] | None = None
) -> PoolStats | None:
    """The pool's stats: snapshots from ``lines`` (one per worker, its newest), window
    counts and ratios from ``windows`` (default: the same lines, one window each).
    ``None`` if no line is usable."""
    good = _usable(lines)
    if not good:
        return None
    counted = good if windows is None else _usable(windows)
    values = _pooled_values(good, counted, FIELDS)
    return PoolStats(
        workers_reporting=len(good),
        windows_counted=len(counted),
        **values,  # type: ignore[arg-type]
    )


def _pooled_values(
    snapshots: Sequence[StatLine], windows: Sequence[StatLine], fields: tuple[StatField, ...]
) -> dict[str, object]:
    """Each pooled attribute of ``fields``, by its rule over its lines."""
    over = {Over.SNAPSHOTS: snapshots, Over.WINDOWS: windows}
    return {
        pool.attr: _pool_value(row.kind, pool, over[pool.over], attr)
        for row, attr, pool in pooled(fields)
    }


def _pool_value(kind: Kind, pool: Pool, lines: Sequence[StatLine], attr: str) -> object:
    values: list[Any] = [getattr(line, attr) for line in lines]
    match pool.rule:
        case Rule.SAME:
            distinct = set(values)
            return distinct.pop() if len(distinct) == 1 else MIXED_MODE
        case Rule.SUM:
            return _sum(kind, values)
        case Rule.SUM_PRESENT:
            if kind is Kind.FLOAT:
                present = _present(values)
                return sum(present) if present else None
            counts = [value for value in values if value is not None]
            return sum(counts) if counts else None
        case Rule.MEAN_PRESENT:
            present = _present(values)
            return sum(present) / len(present) if present else None
        case Rule.WEIGHTED_MEAN:
            assert pool.weight is not None, pool
            weights = [_weight(line, pool.weight) for line in lines]
            return _weighted_mean(zip(values, weights, strict=True))


def _sum(kind: Kind, values: list[Any]) -> object:
    match kind:
        case Kind.INT | Kind.INT_PAIR:  # a pair's attributes are counts each
            return sum(values)
        case Kind.VICTIMS:
            return _sum_victims(values)
        case Kind.HISTOGRAM:
            return ttft_histogram.summed(values)
        case _:
            raise TypeError(f"{kind} values do not add up")


def _weight(line: StatLine, weight: Weight) -> int:
    value = getattr(line, weight.attr)
    count: int = value if weight.key is None else value.get(weight.key, 0)
    if count == 0 and weight.fallback is not None:
        fallback: int = getattr(line, weight.fallback)
        return fallback
    return count


def _status_rows() -> list[tuple[StatField, Pool, Status]]:
    """The pooled attributes ``status.preemption`` shows, group by group, in row order."""
    rows = [(row, pool, pool.status) for row, _, pool in pooled(FIELDS) if pool.status]
    groups = list(StatusGroup)
    return sorted(rows, key=lambda entry: groups.index(entry[2].group))


_STATUS_ROWS = _status_rows()
