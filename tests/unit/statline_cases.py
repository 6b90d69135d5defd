"""Shared stat-line fixtures: the example of docs/design.md#stat-line, snapshots, a strategy."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from genpool_core.names import OFF_MODE, SLO_MODE, TPOT_MODE
from genpool_core.statline import (
    StatLine,
)
from genpool_core.stats import SchedulerStats, SloModeStats, TpotModeStats

SLO, TPOT, OFF = SLO_MODE, TPOT_MODE, OFF_MODE

# The example line of docs/design.md#stat-line, verbatim.
DESIGN_EXAMPLE = (
    "gen_preemption stats t=1712.0 mode=target_output_tps T=18.50 residents=40 active=32 "
    "paused=8 cap=12 headroom=12 waiters=5 at_risk=2 X=0.84 below_target=0.115/0.121 "
    "credit=3.40 victims=laxity:40,below_target:10,sacrificed:7 mean_laxity=1.27 "
    "laxity_resumes=38 forced_resumes=17 paused_below_target=1 completed=180/5230 "
    "slo_completed=200/5000 pauses=57/2110"
)


def slo_snapshots() -> tuple[SchedulerStats, SchedulerStats]:
    """Two cumulative snapshots whose window is exactly the design's example line."""
    prev = SchedulerStats(
        t=1682.0,
        mode=SLO,
        target_output_tps=18.5,
        residents=38,
        active=32,
        paused=6,
        paused_cap=12,
        resident_headroom=12,
        waiters=9,
        at_risk=4,
        admission_target_s=0.9,
        completed=5050,
        aborted=3,
        pauses=2053,
        victims={"laxity": 60, "below_target": 20, "sacrificed": 5},
        laxity_sum=70.0,
        laxity_resumes=52,
        forced_resumes=23,
        slo_completed=4800,
        below_target=582,
        mode_stats=SloModeStats(credit=1.0, paused_below_target=3),
    )
    cur = SchedulerStats(
        t=1712.0,
        mode=SLO,
        target_output_tps=18.5,
        residents=40,
        active=32,
        paused=8,
        paused_cap=12,
        resident_headroom=12,
        waiters=5,
        at_risk=2,
        admission_target_s=0.84,
        completed=5230,
        aborted=4,
        pauses=2110,
        # sacrificed first: the line orders kinds laxity, below_target, sacrificed.
        victims={"sacrificed": 12, "laxity": 100, "below_target": 30},
        laxity_sum=120.8,  # window sum 50.8 over 40 laxity victims -> mean 1.27
        laxity_resumes=90,
        forced_resumes=40,
        slo_completed=5000,  # window: 23 below of 200 -> 0.115; total 605/5000 -> 0.121
        below_target=605,
        mode_stats=SloModeStats(credit=3.4, paused_below_target=1),
    )
    return prev, cur


def tpot_snapshots() -> tuple[SchedulerStats, SchedulerStats]:
    prev = SchedulerStats(
        t=30.0,
        mode=TPOT,
        target_output_tps=None,
        residents=70,
        active=64,
        paused=6,
        paused_cap=24,
        resident_headroom=24,
        waiters=100,
        at_risk=10,
        admission_target_s=1.5,
        completed=400,
        pauses=90,
        victims={"wait": 90},
        forced_resumes=80,
        mode_stats=TpotModeStats(budget=0.1, window_s=0.25),
    )
    cur = SchedulerStats(
        t=60.04,
        mode=TPOT,
        target_output_tps=None,
        residents=80,
        active=64,
        paused=16,
        paused_cap=24,
        resident_headroom=24,
        waiters=120,
        at_risk=7,
        admission_target_s=1.2345,
        completed=1000,
        pauses=150,
        victims={"wait": 150},
        forced_resumes=125,
        # tpot mode has no laxity: these must not show up on the line.
        laxity_sum=9.0,
        laxity_resumes=7,
        mode_stats=TpotModeStats(budget=0.1, window_s=0.3536, inflation=0.0812),
    )
    return prev, cur


def off_snapshots() -> tuple[SchedulerStats, SchedulerStats]:
    prev = SchedulerStats(
        t=0.0,
        mode=OFF,
        target_output_tps=None,
        residents=0,
        active=0,
        paused=0,
        paused_cap=0,
        resident_headroom=0,
        waiters=0,
        at_risk=0,
        admission_target_s=None,
        completed=0,
    )
    cur = dataclasses.replace(
        prev, t=29.96, residents=16, active=16, waiters=3, admission_target_s=0.256, completed=77
    )
    return prev, cur


_COMMON_FLOATS = {"t": 1, "admission_target_s": 2}
_MODE_FLOATS = {
    SLO: {
        "target_output_tps": 2,
        "below_target_window": 3,
        "below_target_total": 3,
        "credit": 2,
        "mean_laxity": 2,
    },
    TPOT: {"tpot_budget": 3, "window_s": 3, "inflation": 3},
    OFF: {},
}
_SLO_ONLY_OTHERS = {"laxity_resumes": 0, "paused_below_target": None}
_ALL_MODE_FLOATS = {name for digits in _MODE_FLOATS.values() for name in digits}


def expected_after_round_trip(line: StatLine) -> StatLine:
    """What parse(format(line)) must give: floats rounded, other modes' fields unset
    (``below_target`` is printed in any mode once there is a total)."""
    changes: dict[str, object] = {}
    printed = {**_COMMON_FLOATS, **_MODE_FLOATS.get(line.mode, {})}
    if line.below_target_total is not None:  # own-floor attainment shows in every mode
        printed |= {"below_target_window": 3, "below_target_total": 3}
    for name in _ALL_MODE_FLOATS | set(_COMMON_FLOATS):
        value = getattr(line, name)
        if name not in printed:
            changes[name] = None
        elif value is not None:
            changes[name] = round(value, printed[name]) + 0.0  # -0.0 -> 0.0
    if line.mode != SLO:
        changes.update(_SLO_ONLY_OTHERS)
    if line.batch_seconds is not None:  # shown once the worker has seen a request
        shown = line.arrivals_total > 0
        changes["batch_seconds"] = round(line.batch_seconds, 1) + 0.0 if shown else None
    return dataclasses.replace(line, **changes)  # type: ignore[arg-type]


_counts = st.integers(min_value=0, max_value=10**12)
_finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
_opt_finite = st.none() | _finite
_kind = st.sampled_from(["laxity", "below_target", "sacrificed", "wait"]) | st.from_regex(
    r"\A[a-z][a-z_]{0,11}\Z"
)


@st.composite
def statlines(draw: st.DrawFn) -> StatLine:
    return StatLine(
        t=draw(st.floats(min_value=0.0, max_value=1e9)),
        mode=draw(st.sampled_from([SLO, TPOT, OFF])),
        residents=draw(_counts),
        active=draw(_counts),
        paused=draw(_counts),
        cap=draw(_counts),
        headroom=draw(_counts),
        waiters=draw(_counts),
        at_risk=draw(_counts),
        target_output_tps=draw(_opt_finite),
        admission_target_s=draw(_opt_finite),
        below_target_window=draw(_opt_finite),
        below_target_total=draw(_opt_finite),
        credit=draw(_opt_finite),
        victims=draw(st.dictionaries(_kind, _counts, max_size=6)),
        mean_laxity=draw(_opt_finite),
        laxity_resumes=draw(_counts),
        forced_resumes=draw(_counts),
        paused_below_target=draw(st.none() | _counts),
        completed_window=draw(_counts),
        completed_total=draw(_counts),
        pauses_window=draw(_counts),
        pauses_total=draw(_counts),
        tpot_budget=draw(_opt_finite),
        window_s=draw(_opt_finite),
        inflation=draw(_opt_finite),
    )
