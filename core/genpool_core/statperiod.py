"""The scheduler's load counters and the cadence of its stat line.

:class:`LoadCounters` are the cumulative counts behind ``make_stats`` that the
pause lane does not keep; :class:`StatCadence` decides which passes carry a stat
line and turns each snapshot into one (window deltas against the previous one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genpool_core import ttft_histogram
from genpool_core.statline import StatLine, make_statline
from genpool_core.stats import SchedulerStats


@dataclass(slots=True)
class LoadCounters:
    """Cumulative since start."""

    completed: int = 0
    aborted: int = 0
    arrivals: int = 0
    steps: int = 0  # decode passes with a non-empty batch
    batch_sum: int = 0  # batch sizes summed over those passes
    # batch size x pass seconds, summed: decode position-seconds (the law's service time)
    batch_seconds: float = 0.0
    ttft_counts: list[int] = field(default_factory=lambda: [0] * ttft_histogram.NUM_BUCKETS)
    # speculative decoding: drafted tokens verified, and those of them emitted
    drafted: int = 0
    accepted: int = 0

    def count_first_token(self, ttft_s: float) -> None:
        self.ttft_counts[ttft_histogram.bucket_of(ttft_s)] += 1

    def count_drafts(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted

    def count_step(self, batch_size: int, seconds: float) -> None:
        self.steps += 1
        self.batch_sum += batch_size
        self.batch_seconds += batch_size * max(0.0, seconds)


class StatCadence:
    """One stat line per ``interval_s``; the first pass only starts the clock."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next_at: float | None = None
        self._last: SchedulerStats | None = None

    def is_due(self, now: float) -> bool:
        """Whether this pass carries a line; a due pass moves the clock past ``now``."""
        if self._next_at is None:
            self._next_at = now + self.interval_s
            return False
        if now < self._next_at:
            return False
        while self._next_at <= now:
            self._next_at += self.interval_s
        # A pass that came late must not cut the next line at once: lines are known by
        # their time printed to 0.1 s, so two lines stay at least 0.75 intervals apart.
        self._next_at = max(self._next_at, now + 0.75 * self.interval_s)
        return True

    def line(self, stats: SchedulerStats) -> StatLine:
        line = make_statline(stats, self._last)
        self._last = stats
        return line
