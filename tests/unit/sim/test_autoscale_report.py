"""The replica-law study's arithmetic (bench/autoscale_report.py) and its loads
(bench/autoscale_cases.py): the oracle's table and schedule, paired ratios, the goals."""

from __future__ import annotations

import math

import pytest

from bench import autoscale_cases as cases
from bench import autoscale_report as report
from genpool_sim.workload import RatePhase


def metrics(cost: float, met: float = 1.0) -> dict[str, float]:
    return {"replica_seconds": cost, "slo_windows_met": met, "ttft_p90": 0.1,
            "below_target": 0.0}  # fmt: skip


def test_the_oracle_takes_each_rates_fewest_replicas_that_meet_the_slo() -> None:
    assert report.fewest_meeting({3: [0.9, 0.97], 4: [0.96, 0.95], 5: [1.0, 1.0]}) == 4
    assert report.fewest_meeting({3: [0.9, 0.92]}) is None
    phases = [RatePhase(540.0, 4.0), RatePhase(90.0, 8.0), RatePhase(90.0, 12.0),
              RatePhase(600.0, 12.0), RatePhase(300.0, 4.0)]  # fmt: skip
    need = {4.0: 3, 8.0: 5, 12.0: 7}
    assert report.oracle_schedule(phases, need) == ((0.0, 3), (540.0, 5), (630.0, 7),
                                                    (1320.0, 3))  # fmt: skip


def test_ratios_are_paired_seed_by_seed() -> None:
    runs = {"genpool": [metrics(80.0), metrics(90.0)],
            "replicas-only": [metrics(100.0), metrics(100.0)]}  # fmt: skip
    ratio = report.paired_ratio(runs, "genpool", "replicas-only")
    assert ratio is not None and ratio["per_seed"] == [0.8, 0.9]
    assert ratio["mean"] == pytest.approx(0.85) and ratio["ci95"] > 0
    assert report.paired_ratio(runs, "genpool", "oracle") is None


def test_the_goals_say_what_holds_with_the_numbers() -> None:
    runs = {
        "static": [metrics(200.0), metrics(200.0)],
        "oracle": [metrics(100.0), metrics(100.0)],
        "replicas-only": [metrics(140.0, 0.9), metrics(140.0, 0.92)],
        "genpool": [metrics(110.0, 0.96), metrics(112.0, 0.97)],
        "llm-d-slo": [metrics(150.0, 0.97), metrics(160.0, 0.98)],
    }
    goals = report.goals(runs)
    assert goals["windows_met"] == {"value": pytest.approx(0.965), "met": True}
    assert goals["vs_oracle"]["met"] and goals["vs_oracle"]["value"] == pytest.approx(1.11)
    assert goals["vs_static"]["met"] and goals["vs_static"]["allowed"]
    assert goals["vs_replicas_only"]["met"]
    # cheaper than llm-d, but fewer windows met: not "equal or better attainment"
    assert goals["vs_llm_d_slo"]["value"] < 1 and not goals["vs_llm_d_slo"]["met"]


def test_a_shape_where_the_oracle_saves_little_does_not_allow_the_static_goal() -> None:
    runs = {"static": [metrics(100.0)], "oracle": [metrics(95.0)],
            "genpool": [metrics(97.0)]}  # fmt: skip
    verdict = report.goals(runs)["vs_static"]
    assert verdict["allowed"] is False and verdict["met"] is False
    assert math.isnan(verdict["ci95"])  # one seed: no interval


def test_every_study_shape_stays_on_its_levels_and_starts_with_the_warm_up() -> None:
    low = cases.CONV.low_rate
    grid = set(cases.levels(low))
    assert min(grid) == low and max(grid) == 3 * low and len(grid) == cases.LEVELS
    for name in cases.SHAPES:
        phases = cases.SHAPES[name](low)
        assert phases[0].rate == low and phases[0].duration_s >= cases.WARMUP_S
        assert {p.rate for p in phases} <= grid, name
    bursts = cases.burst_shape(low, 90.0)
    assert [p.duration_s for p in bursts[1:3]] == [90.0, 300.0] and bursts[1].rate == 2 * low
    names = [load.name for load in cases.GOAL_LOADS]
    assert len(names) == len(set(names)) and "step/conv/cv2/slo2/T12" in names
    assert {load.cv for load in cases.GOAL_LOADS} == {1.0, 2.0, 4.0}


def test_the_tables_show_each_policy_and_each_verdict() -> None:
    from bench import autoscale_tables as tables

    runs = {
        "static": [metrics(200.0), metrics(200.0)],
        "oracle": [metrics(100.0), metrics(100.0)],
        "replicas-only": [metrics(140.0, 0.9), metrics(140.0, 0.92)],
        "genpool": [metrics(110.0, 0.96), metrics(112.0, 0.97)],
    }
    row = {"load": "step/conv", "static_replicas": 5, "per_seed": runs,
           "summary": report.summarize(runs), "goals": report.goals(runs)}  # fmt: skip
    goals = tables.goals_table([row])
    assert "| step/conv | 200 (2.00x) [5] | 100 | 140 (1.40x) | 111 (1.11x) | - |" in goals
    assert "| windows met, mean / worst seed (%) | 100.0 / 100 |" in goals
    verdicts = tables.verdicts_table([row])
    assert "96.5 % **met**" in verdicts and "1.11 ± " in verdicts and "| - |" in verdicts
