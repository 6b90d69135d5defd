"""Stat-line freshness: which pods' lines are new, and whether the pool's stats are stale.

Pure; the operator keeps a :class:`LineClock` per pool in memory between rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from genpool_core.statline import StatLine

STALE_INTERVALS = 2  # stats are stale when no pod's line moved for this many intervals


@dataclass(frozen=True, slots=True)
class LineClock:
    """What the operator has seen of each pod's stat lines (not persisted: after a
    restart the first round simply counts as fresh)."""

    last_t: Mapping[str, float] = field(default_factory=dict)  # each pod's newest line time
    last_advance: Mapping[str, float] = field(default_factory=dict)  # when it last moved
    started_at: float | None = None


class Freshness(NamedTuple):
    seen: LineClock
    is_stale: bool  # no pod's line moved for STALE_INTERVALS intervals
    has_advanced: bool  # some pod has a line the tuner has not seen


def observe(
    seen: LineClock, lines: Mapping[str, StatLine], *, now: float, interval: float
) -> Freshness:
    """Stale when no pod's line moved for two intervals; advanced when some pod has a
    line the tuner has not seen (so it never counts one twice)."""
    last_t, last_advance = dict(seen.last_t), dict(seen.last_advance)
    has_advanced = False
    for pod, line in lines.items():
        if last_t.get(pod) != line.t:
            last_t[pod], last_advance[pod] = line.t, now
            has_advanced = True
    started_at = now if seen.started_at is None else seen.started_at
    clock = LineClock(last_t, last_advance, started_at)
    newest = max((last_advance.get(pod, 0.0) for pod in lines), default=None)
    if newest is None:
        # Nothing reports: stale once we have waited long enough to expect a line.
        return Freshness(clock, now - started_at > STALE_INTERVALS * interval, False)
    return Freshness(clock, now - newest > STALE_INTERVALS * interval, has_advanced)
