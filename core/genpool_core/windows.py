"""Which stat windows a round counts: each pod's window enters the pool's aggregate once.

A worker cuts its windows on its own clock (one line per stat interval); the controller
reads them on another. Between two rounds a pod may have cut no new window (the round
came early, or the pod is slow) or several (the round came late). So a round is given
each pod's recent lines, oldest first (the worker keeps a few, and a pod log holds them
all), and counts exactly the ones newer than the last it counted for that pod: an
unchanged pod adds nothing, a pod that moved twice adds both windows. Snapshot values
(paused, waiters, the knobs in force) come from each pod's newest line whether it moved
or not.

A window is known by its end ``t`` as the line prints it (to
``stat_fields.MIN_STAT_INTERVAL_S``; the worker refuses a shorter stat interval).

Pure; :class:`WindowClock` is state, kept by the caller (the operator in the GenPool's
status, the simulator in memory).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from genpool_core.statline import StatLine

STALE_INTERVALS = 2  # the pool's stats are stale when no window entered for this many


@dataclass(frozen=True, slots=True)
class WindowClock:
    """What a controller has counted of each pod's windows."""

    last_t: Mapping[str, float] = field(default_factory=dict)  # each pod's newest counted end
    entered_at: float | None = None  # controller clock: when a window last entered
    started_at: float | None = None  # controller clock: the first round

    def to_status(self) -> dict[str, object]:
        return {
            "lastWindowEnd": dict(sorted(self.last_t.items())),
            "enteredAt": self.entered_at,
            "startedAt": self.started_at,
        }

    @classmethod
    def from_status(cls, status: Mapping[str, object] | None) -> WindowClock:
        """Tolerant: anything unreadable is forgotten (the next round counts newest lines)."""
        if not isinstance(status, Mapping):
            return cls()
        ends = status.get("lastWindowEnd")
        last_t = {}
        if isinstance(ends, Mapping):
            last_t = {str(pod): float(t) for pod, t in ends.items() if _is_time(t)}
        entered, started = status.get("enteredAt"), status.get("startedAt")
        return cls(
            last_t,
            float(entered) if _is_time(entered) else None,  # type: ignore[arg-type]
            float(started) if _is_time(started) else None,  # type: ignore[arg-type]
        )


def _is_time(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class PoolWindows:
    """One round's view of the pool's stat lines."""

    clock: WindowClock  # after this round
    latest: tuple[StatLine, ...]  # each reporting pod's newest line: the snapshot values
    new: tuple[StatLine, ...]  # the windows not counted before, each once
    is_stale: bool  # no window entered for STALE_INTERVALS intervals

    @property
    def has_new(self) -> bool:
        return bool(self.new)


def take_windows(
    clock: WindowClock,
    lines: Mapping[str, Sequence[StatLine]],
    *,
    now: float,
    interval_s: float,
) -> PoolWindows:
    """Count each pod's windows newer than the last one counted for it.

    A pod seen for the first time (new, or the clock was lost) counts only its newest
    line: older ones may predate anything this controller should judge. Pods that no
    longer report are forgotten.
    """
    last_t: dict[str, float] = {}
    latest: list[StatLine] = []
    new: list[StatLine] = []
    for pod in sorted(lines):
        ordered = sorted((ln for ln in lines[pod] if math.isfinite(ln.t)), key=lambda ln: ln.t)
        if not ordered:
            continue
        newest = ordered[-1]
        latest.append(newest)
        seen = clock.last_t.get(pod)
        new += [newest] if seen is None else [ln for ln in ordered if ln.t > seen]
        last_t[pod] = newest.t
    started_at = now if clock.started_at is None else clock.started_at
    entered_at = now if new else clock.entered_at
    since = started_at if entered_at is None else entered_at
    is_stale = now - since > STALE_INTERVALS * interval_s
    return PoolWindows(
        WindowClock(last_t, entered_at, started_at), tuple(latest), tuple(new), is_stale
    )
