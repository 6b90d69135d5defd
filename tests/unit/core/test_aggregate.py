"""Pool aggregation of per-worker stat lines (genpool_core.aggregate)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from genpool_core.aggregate import MIXED_MODE, aggregate, victims_text
from genpool_core.statline import StatLine, parse_statline

DATA = Path(__file__).parent / "data"


def line(**fields: object) -> StatLine:
    base: dict[str, object] = {
        "t": 30.0, "mode": "target_output_tps", "residents": 20, "active": 16, "paused": 4,
        "cap": 6, "headroom": 6, "waiters": 3, "at_risk": 1, "credit": 2.0,
        "below_target_window": 0.1, "below_target_total": 0.1, "completed_window": 10,
        "completed_total": 100, "pauses_window": 5, "pauses_total": 50,
        "victims": {"laxity": 4}, "mean_laxity": 3.0, "paused_below_target": 0,
        "admission_target_s": 1.0,
    }  # fmt: skip
    return StatLine(**(base | fields))  # type: ignore[arg-type]


def test_counters_are_summed() -> None:
    pool = aggregate([line(), line(paused=2, waiters=7, at_risk=0, victims={"laxity": 1,
                     "sacrificed": 2})])  # fmt: skip
    assert pool is not None
    assert pool.workers_reporting == 2
    assert (pool.paused, pool.paused_cap, pool.resident_headroom) == (6, 12, 12)
    assert (pool.waiters, pool.at_risk) == (10, 1)
    assert (pool.completed_window, pool.pauses_window) == (20, 10)
    assert dict(pool.victims) == {"laxity": 5, "sacrificed": 2}
    assert pool.victims_window == 7
    assert pool.victim_share("sacrificed") == pytest.approx(2 / 7)


def test_below_target_is_weighted_by_the_completions_it_was_counted_over() -> None:
    # worker a finished 90 requests but only 10 counted against a floor (the rest were
    # unkeyed probes); b's 20 all counted: the pool's share weighs 10 and 20, not 90 and 20
    a = line(
        below_target_window=0.5,
        completed_window=90,
        slo_completed_window=10,
        below_target_total=0.5,
        completed_total=900,
        slo_completed_total=100,
    )
    b = line(below_target_window=0.05, completed_window=20, slo_completed_window=20,
             below_target_total=0.05, completed_total=200, slo_completed_total=200)  # fmt: skip
    pool = aggregate([a, b])
    assert pool is not None
    assert pool.below_target_window == pytest.approx((0.5 * 10 + 0.05 * 20) / 30)
    assert pool.below_target_total == pytest.approx((0.5 * 100 + 0.05 * 200) / 300)
    assert pool.slo_completed_window == 30


def test_ratios_are_weighted_by_what_they_count() -> None:
    # lines from older workers carry no slo_completed: their completions weigh instead
    busy = line(below_target_window=0.1, completed_window=90, below_target_total=0.2,
                completed_total=100)  # fmt: skip
    idle = line(below_target_window=1.0, completed_window=10, below_target_total=0.0,
                completed_total=300)  # fmt: skip
    pool = aggregate([busy, idle])
    assert pool is not None
    assert pool.below_target_window == pytest.approx((0.1 * 90 + 1.0 * 10) / 100)
    assert pool.below_target_total == pytest.approx(0.2 * 100 / 400)


def test_mean_laxity_is_the_pooled_mean_over_laxity_victims() -> None:
    pool = aggregate([line(mean_laxity=1.0, victims={"laxity": 3}),
                      line(mean_laxity=5.0, victims={"laxity": 1, "below_target": 9})])  # fmt: skip
    assert pool is not None
    assert pool.mean_laxity == pytest.approx((1.0 * 3 + 5.0) / 4)


def test_credit_reports_the_pool_budget() -> None:
    pool = aggregate([line(credit=4.0), line(credit=-1.5), line(credit=None)])
    assert pool is not None
    assert pool.credit_sum == pytest.approx(2.5)


def test_missing_fields_stay_missing() -> None:
    tpot = line(mode="tpot_budget", credit=None, below_target_window=None,
                below_target_total=None, mean_laxity=None, paused_below_target=None,
                admission_target_s=None)  # fmt: skip
    pool = aggregate([tpot, replace(tpot, completed_window=0)])
    assert pool is not None
    assert pool.mode == "tpot_budget"
    assert pool.below_target_window is None and pool.credit_sum is None
    assert pool.mean_laxity is None and pool.paused_below_target is None
    assert pool.admission_target_mean_s is None


def test_no_completions_in_the_window_means_no_window_ratio() -> None:
    pool = aggregate([line(completed_window=0, below_target_window=None)])
    assert pool is not None and pool.below_target_window is None


def test_garbage_pods_are_ignored() -> None:
    good = line(t=61.0)
    pool = aggregate([None, parse_statline("garbage"), good, parse_statline(b"\xff\xfe")])
    assert pool is not None
    assert pool.workers_reporting == 1


@pytest.mark.parametrize("lines", [[], [None], [None, None]])
def test_nothing_usable_is_none(lines: list[StatLine | None]) -> None:
    assert aggregate(lines) is None


def test_mixed_modes_are_flagged_and_targets_summarised() -> None:
    pool = aggregate([line(admission_target_s=1.0), line(mode="off", admission_target_s=3.0)])
    assert pool is not None
    assert pool.mode == MIXED_MODE
    assert pool.admission_target_mean_s == 2.0


def test_status_shape_is_camel_case_and_json_safe() -> None:
    pool = aggregate([line(victims={"laxity": 40, "below_target": 10, "sacrificed": 7}),
                      line(credit=1.23456, mean_laxity=1.0 / 3.0)])  # fmt: skip
    assert pool is not None
    status = pool.to_status()
    assert set(status) == {
        "paused", "cap", "headroom", "kvUsage", "kvPausedShare", "pauseBudget",
        "belowTargetWindow", "belowTargetTotal", "credit",
        "victims", "victimsText", "meanLaxitySeconds", "laxityResumes", "pausedBelowTarget",
        "waiters", "atRisk", "admissionTargetSeconds",
    }  # fmt: skip
    assert status["victims"] == {"laxity": 44, "belowTarget": 10, "sacrificed": 7}
    assert status["victimsText"] == "laxity:44,below_target:10,sacrificed:7"
    assert status["credit"] == 3.23
    json.dumps(status, allow_nan=False)


def test_status_drops_non_finite_values() -> None:
    pool = aggregate([line()])
    assert pool is not None
    status = replace(pool, credit_sum=math.inf, mean_laxity=math.nan).to_status()
    assert status["credit"] is None and status["meanLaxitySeconds"] is None
    json.dumps(status, allow_nan=False)


def test_victims_text_order() -> None:
    assert victims_text({}) == "-"
    assert victims_text({"zeta": 1, "sacrificed": 2, "laxity": 0, "wait": 3}) == (
        "sacrificed:2,wait:3,zeta:1"
    )


def test_recorded_simulator_round_aggregates_every_worker() -> None:
    text = (DATA / "unspent.txt").read_text().splitlines()
    first_round = [parse_statline(t) for t in text if " t=30." in t]
    pool = aggregate(first_round)
    assert pool is not None
    assert pool.workers_reporting == 8
    assert pool.paused_cap == 48 and pool.resident_headroom == 48
    assert pool.completed_window == sum(line.completed_window for line in first_round if line)
