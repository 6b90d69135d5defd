"""Each pod's stat windows enter the pool's aggregate once (genpool_core.windows)."""

from __future__ import annotations

import math

from genpool_core.aggregate import aggregate
from genpool_core.statline import StatLine
from genpool_core.windows import STALE_INTERVALS, WindowClock, take_windows

INTERVAL = 30.0


def line(t: float, completed: int = 10, waiters: int = 0) -> StatLine:
    return StatLine(t=t, mode="target_output_tps", residents=4, active=4, paused=0, cap=2,
                    headroom=2, waiters=waiters, completed_window=completed,
                    completed_total=int(t), arrivals_window=completed)  # fmt: skip


def take(clock: WindowClock, lines: dict[str, list[StatLine]], now: float):  # type: ignore[no-untyped-def]
    return take_windows(clock, lines, now=now, interval_s=INTERVAL)


def test_an_unchanged_pod_adds_nothing_and_a_pod_that_moved_twice_adds_both() -> None:
    first = take(WindowClock(), {"a": [line(30.0)], "b": [line(31.0)]}, now=35.0)
    assert [ln.t for ln in first.new] == [30.0, 31.0]
    # next round: pod a cut two windows since (the round came late), pod b none
    second = take(first.clock, {"a": [line(30.0), line(60.0, 7), line(90.0, 5)],
                                "b": [line(31.0, waiters=3)]}, now=95.0)  # fmt: skip
    assert [ln.t for ln in second.new] == [60.0, 90.0]
    assert [ln.t for ln in second.latest] == [90.0, 31.0]  # snapshots from every pod
    pool = aggregate(second.latest, second.new)
    assert pool is not None
    assert (pool.completed_window, pool.windows_counted, pool.workers_reporting) == (12, 2, 2)
    assert pool.waiters == 3  # b's snapshot counts though its window does not
    # the old aggregate of newest lines would have counted b's window again and lost a's 60
    naive = aggregate(second.latest)
    assert naive is not None and naive.completed_window == 15


def test_a_new_pod_counts_only_its_newest_line_and_a_gone_pod_is_forgotten() -> None:
    clock = take(WindowClock(), {"a": [line(30.0)]}, now=30.0).clock
    joined = take(clock, {"a": [line(60.0)], "b": [line(10.0), line(40.0), line(70.0)]}, 70.0)
    assert [ln.t for ln in joined.new] == [60.0, 70.0]
    left = take(joined.clock, {"b": [line(100.0)]}, now=100.0)
    assert set(left.clock.last_t) == {"b"}


def test_stale_when_no_window_entered_for_two_intervals() -> None:
    clock = take(WindowClock(), {"a": [line(30.0)]}, now=0.0).clock
    assert not take(clock, {"a": [line(30.0)]}, now=STALE_INTERVALS * INTERVAL).is_stale
    stale = take(clock, {"a": [line(30.0)]}, now=STALE_INTERVALS * INTERVAL + 1)
    assert stale.is_stale and not stale.has_new
    # nothing reports: stale once a line was due, not on the first round
    assert not take(WindowClock(), {}, now=0.0).is_stale
    quiet = take(WindowClock(), {}, now=0.0).clock
    assert take(quiet, {}, now=61.0).is_stale


def test_the_clock_round_trips_and_garbage_is_forgotten() -> None:
    clock = take(WindowClock(), {"p-0": [line(30.0)], "p-1": [line(29.5)]}, now=31.0).clock
    assert WindowClock.from_status(clock.to_status()) == clock
    assert WindowClock.from_status(None) == WindowClock()
    garbage = {"lastWindowEnd": {"a": "x", "b": 3, "c": math.nan, "d": True},
               "enteredAt": "soon", "startedAt": math.inf}  # fmt: skip
    assert WindowClock.from_status(garbage) == WindowClock({"b": 3.0}, None, None)
    assert WindowClock.from_status({"lastWindowEnd": [1, 2]}) == WindowClock()


def test_non_finite_times_are_skipped() -> None:
    bad = StatLine(t=math.inf, mode="off", residents=0, active=0, paused=0, cap=0,
                   headroom=0, waiters=0)  # fmt: skip
    taken = take(WindowClock(), {"a": [bad]}, now=0.0)
    assert taken.latest == () and taken.new == ()
