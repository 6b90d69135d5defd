"""The stat line (docs/design.md#stat-line): window/total maths, exact text, round trip."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genpool_core.preemption import GenCapacity
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_core.statline import (
    MARKER,
    StatLine,
    format_statline,
    make_statline,
    parse_statline,
)
from genpool_core.stats import TpotModeStats
from tests.unit.statline_cases import (
    DESIGN_EXAMPLE,
    OFF,
    SLO,
    expected_after_round_trip,
    off_snapshots,
    slo_snapshots,
    statlines,
    tpot_snapshots,
)

# -- make_statline: window = cur - prev, totals = cur ----------------------------------


def test_slo_window_and_total_fields() -> None:
    prev, cur = slo_snapshots()
    line = make_statline(cur, prev)
    assert line.t == 1712.0
    assert line.mode == SLO
    assert line.target_output_tps == 18.5
    assert (line.residents, line.active, line.paused) == (40, 32, 8)
    assert (line.cap, line.headroom, line.waiters, line.at_risk) == (12, 12, 5, 2)
    assert line.admission_target_s == 0.84
    assert line.below_target_window == pytest.approx(23 / 200)
    assert line.below_target_total == pytest.approx(605 / 5000)
    assert line.credit == 3.4
    assert line.victims == {"laxity": 40, "below_target": 10, "sacrificed": 7}
    assert line.mean_laxity == pytest.approx(50.8 / 40)
    assert line.laxity_resumes == 38
    assert line.forced_resumes == 17
    assert line.paused_below_target == 1
    assert (line.completed_window, line.completed_total) == (180, 5230)
    assert (line.pauses_window, line.pauses_total) == (57, 2110)


def test_slo_line_is_the_design_example_exactly() -> None:
    prev, cur = slo_snapshots()
    assert format_statline(make_statline(cur, prev)) == DESIGN_EXAMPLE


def test_tpot_line_exact_text() -> None:
    prev, cur = tpot_snapshots()
    text = format_statline(make_statline(cur, prev))
    assert text == (
        "gen_preemption stats t=60.0 mode=tpot_budget budget=0.100 window=0.354 "
        "inflation=0.081 residents=80 active=64 paused=16 cap=24 headroom=24 waiters=120 "
        "at_risk=7 X=1.23 victims=wait:60 forced_resumes=45 completed=600/1000 pauses=60/150"
    )


def test_tpot_line_without_inflation_yet_prints_dash() -> None:
    prev, cur = tpot_snapshots()
    cur = dataclasses.replace(cur, mode_stats=TpotModeStats(budget=0.1, window_s=0.25))
    text = format_statline(make_statline(cur, prev))
    assert " budget=0.100 window=0.250 inflation=- residents=80 " in text
    parsed = parse_statline(text)
    assert parsed is not None
    assert parsed.inflation is None
    assert parsed.window_s == 0.25


def test_off_line_exact_text() -> None:
    prev, cur = off_snapshots()
    text = format_statline(make_statline(cur, prev))
    assert text == (
        "gen_preemption stats t=30.0 mode=off residents=16 active=16 paused=0 cap=0 "
        "headroom=0 waiters=3 at_risk=0 X=0.26 victims=- forced_resumes=0 "
        "completed=77/77 pauses=0/0"
    )


def test_off_line_before_warmup_has_no_target() -> None:
    _, cur = off_snapshots()
    cur = dataclasses.replace(cur, admission_target_s=None)
    text = format_statline(make_statline(cur, None))
    assert " X=- " in text


def test_first_line_without_prev_uses_totals_as_window() -> None:
    _, cur = slo_snapshots()
    line = make_statline(cur, None)
    assert line.victims == {"laxity": 100, "below_target": 30, "sacrificed": 12}
    assert (line.completed_window, line.completed_total) == (5230, 5230)
    assert (line.pauses_window, line.pauses_total) == (2110, 2110)
    assert line.laxity_resumes == 90
    assert line.forced_resumes == 40
    assert line.below_target_window == pytest.approx(605 / 5000)
    assert line.below_target_total == pytest.approx(605 / 5000)
    assert line.mean_laxity == pytest.approx(120.8 / 100)


def test_quiet_window_has_no_ratios_but_keeps_totals() -> None:
    """No SLO completion and no laxity victim in the window: '-' rather than 0 or a crash."""
    _, cur = slo_snapshots()
    later = dataclasses.replace(cur, t=1742.0)  # nothing happened in 30 s
    line = make_statline(later, cur)
    assert line.below_target_window is None
    assert line.below_target_total == pytest.approx(605 / 5000)
    assert line.mean_laxity is None
    # Kinds with no pause in the window are left out, so a quiet window shows "-".
    assert line.victims == {}
    assert (line.completed_window, line.pauses_window) == (0, 0)
    text = format_statline(line)
    assert " below_target=-/0.121 " in text
    assert " mean_laxity=- " in text
    assert " victims=- " in text
    assert text.endswith(" completed=0/5230 slo_completed=0/5000 pauses=0/2110")


def test_no_slo_completions_at_all() -> None:
    _, cur = slo_snapshots()
    cur = dataclasses.replace(cur, slo_completed=0, below_target=0)
    line = make_statline(cur, None)
    assert line.below_target_window is None
    assert line.below_target_total is None
    assert " below_target=-/- " in format_statline(line)


def test_mean_laxity_ignores_other_victim_kinds() -> None:
    prev, cur = slo_snapshots()
    # More below_target/sacrificed victims change nothing: the mean is per laxity victim.
    cur = dataclasses.replace(cur, victims={"laxity": 100, "below_target": 80, "sacrificed": 50})
    assert make_statline(cur, prev).mean_laxity == pytest.approx(50.8 / 40)


def test_new_victim_kind_in_window_counts_from_zero() -> None:
    prev, cur = slo_snapshots()
    cur = dataclasses.replace(cur, victims={**cur.victims, "wait": 3})
    line = make_statline(cur, prev)
    assert line.victims["wait"] == 3
    text = format_statline(line)
    assert "victims=laxity:40,below_target:10,sacrificed:7,wait:3 " in text


def test_kind_without_pauses_in_the_window_is_left_out() -> None:
    prev, cur = slo_snapshots()
    cur = dataclasses.replace(cur, victims={**cur.victims, "sacrificed": 5})  # as in prev
    line = make_statline(cur, prev)
    assert line.victims == {"laxity": 40, "below_target": 10}
    assert " victims=laxity:40,below_target:10 mean_laxity=1.27 " in format_statline(line)


def test_unknown_victim_kinds_sort_after_known_ones() -> None:
    line = StatLine(
        t=1.0,
        mode=OFF,
        residents=0,
        active=0,
        paused=0,
        cap=0,
        headroom=0,
        waiters=0,
        victims={"zeta": 1, "wait": 2, "alpha": 3, "laxity": 4},
    )
    assert " victims=laxity:4,wait:2,alpha:3,zeta:1 " in format_statline(line)


def test_make_statline_without_mode_stats_prints_dashes() -> None:
    _, cur = slo_snapshots()
    cur = dataclasses.replace(cur, mode_stats=None)
    line = make_statline(cur, None)
    assert line.credit is None
    assert line.paused_below_target is None
    text = format_statline(line)
    assert " credit=- " in text
    assert " paused_below_target=- " in text


# -- round trip ------------------------------------------------------------------------


def test_design_example_parses_to_its_fields() -> None:
    line = parse_statline(DESIGN_EXAMPLE)
    assert line is not None
    assert line.t == 1712.0
    assert line.mode == SLO
    assert line.target_output_tps == 18.5
    assert line.admission_target_s == 0.84
    assert (line.below_target_window, line.below_target_total) == (0.115, 0.121)
    assert line.credit == 3.4
    assert line.victims == {"laxity": 40, "below_target": 10, "sacrificed": 7}
    assert line.mean_laxity == 1.27
    assert (line.laxity_resumes, line.forced_resumes, line.paused_below_target) == (38, 17, 1)
    assert (line.completed_window, line.completed_total) == (180, 5230)
    assert (line.pauses_window, line.pauses_total) == (57, 2110)
    assert format_statline(line) == DESIGN_EXAMPLE


@pytest.mark.parametrize("snapshots", [slo_snapshots, tpot_snapshots, off_snapshots])
def test_format_parse_round_trip_of_made_lines(snapshots: object) -> None:
    prev, cur = snapshots()  # type: ignore[operator]
    line = make_statline(cur, prev)
    parsed = parse_statline(format_statline(line))
    assert parsed == expected_after_round_trip(line)
    assert format_statline(parsed) == format_statline(line)


# Fields printed per mode, with the digits each float is printed with.
@given(statlines())
def test_round_trip_property(line: StatLine) -> None:
    text = format_statline(line)
    assert "\n" not in text
    parsed = parse_statline(text)
    assert parsed == expected_after_round_trip(line)
    # Formatting is a fixed point after one round.
    assert format_statline(parsed) == text


@given(statlines(), st.randoms(use_true_random=False))
def test_round_trip_with_shuffled_tokens(line: StatLine, rnd: random.Random) -> None:
    text = format_statline(line)
    tokens = text[len(MARKER) :].split()
    rnd.shuffle(tokens)
    assert parse_statline(f"{MARKER} {' '.join(tokens)}") == parse_statline(text)


# -- the scheduler's own lines ------------------------------------------------------------


def test_scheduler_stat_lines_parse_and_chain_windows() -> None:
    """Lines emitted by GenScheduler parse, and their windows add up to the totals."""
    scheduler = GenScheduler.from_settings(
        {"target_output_tps": 20.0},
        GenCapacity(max_batch_size=4),
        SchedulerConfig(stat_interval_s=1.0),
    )
    rnd = random.Random(7)
    now = 0.0
    serial = 0
    parsed: list[StatLine] = []
    for _ in range(400):
        while scheduler.num_waiting < 6:
            serial += 1
            request = GenRequest(
                f"r{serial}",
                prompt_len=8,
                max_tokens=rnd.randint(2, 30),
                arrival_time=now,
                first_token_time=now,
            )
            scheduler.add_request(request, now)
        plan = scheduler.step(now)
        if plan.stat_line is not None:
            line = parse_statline(plan.stat_line)
            assert line is not None, plan.stat_line
            stats = scheduler.make_stats(now)
            assert line.completed_total == stats.completed
            assert line.pauses_total == stats.pauses
            assert line.residents == scheduler.num_residents
            assert line.waiters == scheduler.num_waiting
            parsed.append(line)
        scheduler.postprocess(plan, now + 0.05)
        now += 0.05
    assert len(parsed) >= 15
    assert all(line.mode == SLO and line.target_output_tps == 20.0 for line in parsed)
    assert parsed[-1].completed_total > 0
    assert sum(line.completed_window for line in parsed) == parsed[-1].completed_total
    assert sum(line.pauses_window for line in parsed) == parsed[-1].pauses_total
    assert [line.t for line in parsed] == sorted(line.t for line in parsed)


def test_scheduler_lines_carry_the_scalers_load_and_ttft_fields() -> None:
    """Arrivals, steps, batch and the GEN TTFT histogram chain to the scheduler's totals."""
    scheduler = GenScheduler.from_settings(
        {}, GenCapacity(max_batch_size=2), SchedulerConfig(stat_interval_s=1.0)
    )
    now, serial, parsed = 0.0, 0, []
    for _ in range(200):
        if serial < 60:
            serial += 1
            request = GenRequest(f"r{serial}", 8, 5, arrival_time=now, first_token_time=now)
            scheduler.add_request(request, now)
        plan = scheduler.step(now)
        if plan.stat_line is not None:
            line = parse_statline(plan.stat_line)
            assert line is not None and "ttft_p90=" in plan.stat_line
            parsed.append(line)
        scheduler.postprocess(plan, now + 0.1)
        now += 0.1
    stats = scheduler.make_stats(now)
    assert sum(line.arrivals_window for line in parsed) == parsed[-1].arrivals_total
    assert parsed[-1].arrivals_total == 60 == stats.arrivals
    # two slots, full while the queue lasts (the very first pass has one request)
    assert parsed[1].batch_mean == 2.0 and 1.8 < (parsed[0].batch_mean or 0.0) < 2.0
    assert sum(line.steps_window for line in parsed) <= stats.steps
    first_tokens = sum(sum(line.ttft_hist) for line in parsed)
    assert 0 < first_tokens <= sum(stats.ttft_counts) == 60
    # the queue grows by one request per step and drains two: TTFT grows with the backlog
    p90s = [line.ttft_p90 for line in parsed if line.ttft_p90 is not None]
    assert len(p90s) >= 3 and p90s[-1] > p90s[0]


def test_a_line_without_the_scaler_fields_parses_with_zeros() -> None:
    line = parse_statline(DESIGN_EXAMPLE)
    assert line is not None
    assert (line.arrivals_window, line.arrivals_total, line.steps_window) == (0, 0, 0)
    assert line.batch_mean is None and line.ttft_hist == () and line.ttft_p90 is None
