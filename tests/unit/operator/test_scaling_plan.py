"""The replica half of a round: settings from the spec, replicas in force, SLO verdict,
the scaler's call with its stabilisation, advisory mode, status and Events."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from genpool_core import ttft_histogram
from genpool_core.aggregate import PoolStats
from genpool_operator.freshness import LineClock
from genpool_operator.round_plan import PushOutcome, plan_round, round_events, status_patch
from genpool_operator.scaling_plan import (
    PoolView,
    ScalingPlan,
    desired_replicas,
    measure_slo,
    merge_slo_condition,
    plan_scaling,
    scaler_settings,
    scaling_status,
    slo_verdict,
    spec_in_force,
)
from genpool_operator.spec import GenPoolSpec
from tests.unit.operator.test_round_plan import LINE, PENDING_RAISE

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


def _spec(**overrides: Any) -> GenPoolSpec:
    return GenPoolSpec.from_body({**AUTO, **overrides})


def _hist(seconds: float, n: int) -> tuple[int, ...]:
    counts = [0] * ttft_histogram.NUM_BUCKETS
    counts[ttft_histogram.bucket_of(seconds)] = n
    return tuple(counts)


def _stats(workers: int = 1, **overrides: Any) -> PoolStats:
    """``workers`` at half occupancy, TTFT well inside 1 s."""
    base = PoolStats(
        workers_reporting=workers, mode="target_output_tps", paused=0, paused_cap=2 * workers,
        resident_headroom=2 * workers, waiters=0, at_risk=0, completed_window=50 * workers,
        pauses_window=0, laxity_resumes=0, below_target_window=0.05,
        arrivals_window=50 * workers, steps_window=500, batch_mean=4.0,
        ttft_hist=_hist(0.1, 50 * workers),
    )  # fmt: skip
    return replace(base, **overrides)


OVERLOAD: dict[str, Any] = {
    "waiters": 30,
    "arrivals_window": 200,
    "batch_mean": 8.0,
    "ttft_hist": _hist(4.0, 60),
}
QUIET: dict[str, Any] = {"batch_mean": 0.5, "arrivals_window": 20, "completed_window": 20}


def test_settings_come_from_the_spec() -> None:
    settings = scaler_settings(_spec())
    assert (settings.ttft_p90_s, settings.attainment) == (1.0, 0.8)
    assert (settings.min_replicas, settings.max_replicas, settings.max_step) == (1, 3, 2)
    assert settings.max_batch == 8 and settings.down_window_s == 20.0
    # Windows are whole intervals, never shorter than asked.
    odd = _spec(autoscaling={**AUTO["autoscaling"], "scaleDownStabilizationSeconds": 25})
    assert scaler_settings(odd).down_window_s == 30.0
    assert settings.cap_max == 8  # the tuner's cap bound: pausing is a lever
    off = scaler_settings(_spec(preemption={"mode": "Off"}))
    assert off.attainment is None and off.cap_max is None  # TTFT alone, no knob lever
    # The shipped ceilings unless the spec names one, which then holds with or without pausing.
    assert (settings.max_utilisation, settings.max_utilisation_with_pausing) == (0.85, 0.95)
    for preemption in (AUTO["preemption"], {"mode": "Off"}):
        ceiling = {**AUTO["autoscaling"], "targetUtilization": 0.6}
        chosen = scaler_settings(_spec(preemption=preemption, autoscaling=ceiling))
        assert (chosen.max_utilisation, chosen.max_utilisation_with_pausing) == (0.6, 0.6)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, "0.8", True])
def test_a_target_utilization_outside_its_range_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"targetUtilization|target_utilization"):
        _spec(autoscaling={**AUTO["autoscaling"], "targetUtilization": bad})


def test_replicas_in_force_are_the_scalers_within_the_bounds() -> None:
    spec = _spec()
    assert desired_replicas(spec, {}) == 1
    assert desired_replicas(spec, {"desiredReplicas": 2}) == 2
    assert desired_replicas(spec, {"desiredReplicas": 9}) == 3  # bounds win at once
    assert desired_replicas(spec, {"desiredReplicas": "2"}) == 1  # garbage: spec.replicas
    assert spec_in_force(spec, {"desiredReplicas": 2}).replicas == 2
    manual = GenPoolSpec.from_body({"replicas": 4})
    assert desired_replicas(manual, {"desiredReplicas": 2}) == 4  # HPA/KEDA or the user
    advisory = _spec(advisory=True)
    assert desired_replicas(advisory, {"desiredReplicas": 3}) == 1  # advice is not applied
    assert spec_in_force(manual, {}) is manual


def test_overload_scales_up_and_says_so() -> None:
    spec = _spec()
    pool = PoolView({"desiredReplicas": 1}, num_ready=1, wall_now=1000.0)
    plan = plan_scaling(spec, pool, _stats(**OVERLOAD), is_due=True)
    assert plan is not None and plan.decision is not None
    assert plan.replicas_before == 1 and plan.desired == 3 and plan.is_news
    assert plan.decision.reason.startswith("up-")
    assert plan.change_text() == f"{plan.decision.reason}: replicas 1 -> 3"


def test_a_round_that_is_not_due_leaves_the_replicas_and_the_status() -> None:
    plan = plan_scaling(_spec(), PoolView({"desiredReplicas": 2}), _stats(), is_due=False)
    assert plan is not None and plan.decision is None and plan.desired == 2
    assert not plan.is_news
    assert plan_scaling(GenPoolSpec.from_body({}), PoolView({}), _stats(), is_due=True) is None


def status_patch_scaling(plan: ScalingPlan) -> dict[str, Any]:
    return scaling_status(plan, {}, "T")


def test_scale_down_waits_for_the_window_restored_from_status() -> None:
    spec = _spec()
    status: dict[str, Any] = {"desiredReplicas": 3}
    decisions = []
    # Rounds come every interval plus their own time: the window still closes.
    for now in (1000.3, 1010.9, 1021.4):
        pool = PoolView(status, num_ready=3, wall_now=now)
        plan = plan_scaling(spec, pool, _stats(3, **QUIET), is_due=True)
        assert plan is not None and plan.decision is not None
        decisions.append((plan.desired, plan.decision.reason))
        # What an operator restart reads back: the window survives in status.
        status = {**status, **status_patch_scaling(plan)}
    assert decisions[0] == (3, "hold-down-window") and decisions[1][0] == 3
    assert decisions[2] == (1, "down-utilisation-low")


def test_scale_up_window_holds_until_every_recommendation_agrees() -> None:
    spec = _spec(autoscaling={**AUTO["autoscaling"], "scaleUpStabilizationSeconds": 20})
    status: dict[str, Any] = {"desiredReplicas": 1}
    seen = []
    for now in (1000.0, 1010.4, 1020.9):
        plan = plan_scaling(spec, PoolView(status, 1, now), _stats(**OVERLOAD), is_due=True)
        assert plan is not None and plan.decision is not None
        seen.append((plan.desired, plan.decision.reason))
        status = {**status, **status_patch_scaling(plan)}
    assert seen[0] == (1, "hold-up-window") and seen[1] == (1, "hold-up-window")
    assert seen[2][0] == 3


def test_advisory_decides_relative_to_what_runs_and_reports_changed_advice_once() -> None:
    spec = _spec(advisory=True)
    first = plan_scaling(spec, PoolView({}, 1, 1000.0), _stats(**OVERLOAD), is_due=True)
    assert first is not None and first.desired == 3 and first.is_news
    assert first.change_text().startswith("advisory, not applied: ")
    status = status_patch_scaling(first)
    assert status["desiredReplicas"] == 3 and status["scaling"]["advisory"] is True
    again = plan_scaling(spec, PoolView(status, 1, 1010.0), _stats(**OVERLOAD), is_due=True)
    assert again is not None and again.desired == 3 and not again.is_news


def test_slo_verdict_names_what_misses() -> None:
    spec = _spec()
    assert slo_verdict(GenPoolSpec.from_body({}), measure_slo(_stats())) is None
    met = slo_verdict(spec, measure_slo(_stats()))
    assert met is not None and met.is_met and met.reason == "WithinTarget"
    slow = slo_verdict(spec, measure_slo(_stats(ttft_hist=_hist(3.0, 50))))
    assert slow is not None and slow.is_met is False and slow.reason == "TTFTAboveTarget"
    lost = slo_verdict(spec, measure_slo(_stats(below_target_window=0.5)))
    assert lost is not None and lost.reason == "AttainmentBelowTarget"
    assert "attainment 0.500 (target 0.8)" in lost.message
    unknown = slo_verdict(spec, measure_slo(None))
    assert unknown is not None and unknown.is_met is None and unknown.reason == "NoSamples"


def test_unknown_slo_keeps_its_transition_time() -> None:
    spec = _spec()
    unknown = slo_verdict(spec, measure_slo(None))
    assert unknown is not None
    first = merge_slo_condition([], unknown, now_iso="T0", observed_generation=2)
    assert first[0]["status"] == "Unknown" and first[0]["lastTransitionTime"] == "T0"
    again = merge_slo_condition(first, unknown, now_iso="T1", observed_generation=2)
    assert again[0]["lastTransitionTime"] == "T0"
    met = slo_verdict(spec, measure_slo(_stats()))
    assert met is not None
    flipped = merge_slo_condition(again, met, now_iso="T2", observed_generation=None)
    assert [(c["status"], c["lastTransitionTime"]) for c in flipped] == [("True", "T2")]


SLOW_LINE = replace(LINE, ttft_hist=_hist(3.0, 60))  # p90 3 s: three times the target


def test_a_round_records_slo_replicas_one_history_and_events() -> None:
    pool = PoolView({"desiredReplicas": 1}, num_ready=1, wall_now=1000.0)
    lines = {"p": SLOW_LINE}
    plan = plan_round(_spec(), PENDING_RAISE, lines, LineClock(), now=0.0, tune=True, pool=pool)
    assert plan.scaling is not None and plan.scaling.decision is not None
    assert plan.scaling.decision.reason == "up-ttft-miss" and plan.scaling.desired == 2
    history = [{"time": str(i), "kind": "Knobs"} for i in range(9)]
    status = {"tuning": {**PENDING_RAISE, "history": history}}
    patch = status_patch(plan, PushOutcome(1, 1), status, observed_generation=1, now_text="T0")
    assert patch["desiredReplicas"] == 2 and patch["scaling"]["reason"] == "up-ttft-miss"
    assert patch["scaling"]["lastChange"]["from"] == 1 and patch["scaling"]["lastChange"]["to"] == 2
    assert patch["slo"]["ttftP90Seconds"] > 1.0 and patch["slo"]["attainment"] == 0.885
    slo_met = next(c for c in patch["conditions"] if c["type"] == "SLOMet")
    assert (slo_met["status"], slo_met["reason"]) == ("False", "TTFTAboveTarget")
    # One history for both, newest last, bounded: the tuner's change, then the scaler's.
    entries = patch["tuning"]["history"]
    assert len(entries) == 10 and [e["kind"] for e in entries[-2:]] == ["Knobs", "Replicas"]
    assert entries[-1]["from"] == {"replicas": 1} and entries[-1]["to"] == {"replicas": 2}
    events = [(e.type, e.reason) for e in round_events(plan, PushOutcome(1, 1))]
    assert events == [("Normal", "Tuned"), ("Normal", "ScaledUp"), ("Warning", "SLOMissed")]


def test_slo_missed_is_an_event_on_the_transition_only() -> None:
    spec = GenPoolSpec.from_body({**AUTO, "autoscaling": {"enabled": False}})
    lines = {"p": SLOW_LINE}
    plan = plan_round(spec, {}, lines, LineClock(), now=0.0, tune=False)
    assert plan.scaling is None
    missed = [e for e in round_events(plan, PushOutcome(1, 1)) if e.reason == "SLOMissed"]
    assert len(missed) == 1 and missed[0].message.startswith("TTFTAboveTarget: TTFT p90")
    status = {"conditions": [{"type": "SLOMet", "status": "False"}]}
    again = plan_round(spec, {}, lines, LineClock(), now=0.0, tune=False, pool=PoolView(status))
    assert not [e for e in round_events(again, PushOutcome(1, 1)) if e.reason == "SLOMissed"]


def test_advisory_knobs_are_recorded_not_pushed() -> None:
    spec = _spec(advisory=True)
    plan = plan_round(spec, PENDING_RAISE, {"p": LINE}, LineClock(), now=0.0, tune=True)
    assert plan.decision is not None and plan.decision.changed
    assert plan.knobs == plan.knobs_before and plan.live["paused_cap"] == 6  # not applied
    patch = status_patch(plan, PushOutcome(1, 1), {}, observed_generation=1, now_text="T0")
    assert patch["tuning"]["pausedCap"] == 6 and patch["tuning"]["lastChange"]["advisory"]
    assert patch["tuning"]["history"][-1]["advisory"] is True
    tuned = [e for e in round_events(plan, PushOutcome(1, 1)) if e.reason == "Tuned"]
    assert tuned[0].message.startswith("advisory, not applied: raise-cap-budget-unspent")


def test_no_reporting_worker_means_stale_stats_at_once() -> None:
    plan = plan_round(_spec(), {}, {}, LineClock(), now=0.0, tune=True)
    patch = status_patch(plan, PushOutcome(0, 2), {}, observed_generation=1, now_text="T0")
    stale = next(c for c in patch["conditions"] if c["type"] == "StatsStale")
    assert (stale["status"], stale["reason"]) == ("True", "NoWorkersReporting")
    assert stale["message"] == "0 of 2 ready workers report a stat line"


def test_turning_autoscaling_off_clears_the_scalers_status() -> None:
    manual = GenPoolSpec.from_body({"replicas": 2})
    plan = plan_round(manual, {}, {"p": LINE}, LineClock(), now=0.0, tune=True)
    status = {"desiredReplicas": 3, "scaling": {"reason": "hold"}}
    patch = status_patch(plan, PushOutcome(1, 1), status, observed_generation=1, now_text="T0")
    assert patch["desiredReplicas"] is None and patch["scaling"] is None
    assert "desiredReplicas" not in status_patch(
        plan, PushOutcome(1, 1), {}, observed_generation=1, now_text="T0"
    )
