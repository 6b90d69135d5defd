"""The replica half of a round: settings from the spec, replicas in force, the scaler's
call with its stabilisation windows, advisory mode, status and Events.

The scaler's state (its recommendations and estimates) and ``desiredReplicas`` live in
the status: each round's patch is applied and read back by the next round."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from genpool_core.knobs import Knobs
from genpool_core.scaler import ScalerSettings
from genpool_core.scaler_settings import DEFAULT_DOWN_WINDOW_S, DEFAULT_MAX_STEP
from genpool_operator.round_plan import (
    PushOutcome,
    controller_settings,
    controller_state,
    plan_round,
    round_events,
    status_patch,
)
from genpool_operator.scaling_plan import (
    desired_replicas,
    history_entry,
    scaler_settings,
    scaling_status,
    spec_in_force,
)
from genpool_operator.spec import GenPoolSpec
from tests.unit.operator.rounds import (
    AUTO,
    LINE,
    ONE,
    OVERLOAD,
    PENDING_RAISE,
    QUIET,
    apply_patch,
    auto_spec,
    autoscaling_spec,
    pods,
    run_round,
    run_rounds,
    statline,
)  # fmt: skip


def test_settings_come_from_the_spec() -> None:
    settings = scaler_settings(auto_spec())
    assert (settings.ttft_p90_s, settings.attainment) == (1.0, 0.8)
    assert (settings.min_replicas, settings.max_replicas, settings.max_step) == (1, 3, 2)
    assert settings.max_batch == 8 and settings.down_window_s == 20.0
    assert settings.up_window_s == 0.0 and settings.interval_s == 10.0
    assert scaler_settings(autoscaling_spec(scaleUpStabilizationSeconds=40)).up_window_s == 40.0
    assert scaler_settings(autoscaling_spec(startupSeconds=150)).startup_s == 150.0
    # The scaler rounds windows up to whole intervals, never shorter than asked.
    odd = scaler_settings(autoscaling_spec(scaleDownStabilizationSeconds=25))
    assert odd.down_window_s == 25.0 and odd.whole_intervals(odd.down_window_s) == 30.0
    assert settings.is_pausing and settings.capacity_override is None  # learned
    off = scaler_settings(auto_spec(preemption={"mode": "Off"}))
    assert off.attainment is None and not off.is_pausing  # TTFT alone, nothing absorbed
    pinned = scaler_settings(autoscaling_spec(targetUtilization=0.6))
    assert pinned.capacity_override == 0.6  # the expert override
    assert controller_settings(auto_spec()).scaler == settings
    assert controller_settings(auto_spec(autoscaling={"enabled": False})).scaler is None


def test_a_pools_law_is_the_simulators_at_every_default() -> None:
    """One source for every default: what the spec leaves unset is ScalerSettings's own."""
    spec = GenPoolSpec.from_body({**AUTO, "autoscaling": {"enabled": True, "maxReplicas": 3}})
    settings = scaler_settings(spec)
    defaults = ScalerSettings(ttft_p90_s=1.0, min_replicas=1, max_replicas=3, max_batch=8)
    for f in fields(ScalerSettings):
        if f.name not in ("interval_s", "is_pausing", "attainment", "ttft_p90_s"):
            assert getattr(settings, f.name) == getattr(defaults, f.name), f.name
    assert (settings.max_step, settings.down_window_s) == (DEFAULT_MAX_STEP,
                                                           DEFAULT_DOWN_WINDOW_S)  # fmt: skip


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, "0.8", True])
def test_a_target_utilization_outside_its_range_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"targetUtilization|target_utilization"):
        autoscaling_spec(targetUtilization=bad)


def test_replicas_in_force_are_the_scalers_within_the_bounds() -> None:
    spec = auto_spec()
    assert desired_replicas(spec, {}) == 1
    assert desired_replicas(spec, {"desiredReplicas": 2}) == 2
    assert desired_replicas(spec, {"desiredReplicas": 9}) == 3  # bounds win at once
    assert desired_replicas(spec, {"desiredReplicas": "2"}) == 1  # garbage: spec.replicas
    assert spec_in_force(spec, {"desiredReplicas": 2}).replicas == 2
    manual = GenPoolSpec.from_body({"replicas": 4})
    assert desired_replicas(manual, {"desiredReplicas": 2}) == 4  # HPA/KEDA or the user
    advisory = auto_spec(advisory=True)
    assert desired_replicas(advisory, {"desiredReplicas": 3}) == 1  # advice is not applied
    assert spec_in_force(manual, {}) is manual


def test_a_recorded_count_outside_the_bounds_is_clamped_at_once() -> None:
    plan, status = run_round(auto_spec(), {"desiredReplicas": 9}, pods(3, 30.0, **QUIET), 1000.0)
    assert plan.decision.scaling is not None
    assert (plan.decision.desired, plan.decision.scaling.reason) == (3, "clamp-to-bounds")
    assert status["desiredReplicas"] == 3


def test_overload_scales_up_and_says_so() -> None:
    plan, status = run_round(auto_spec(), {"desiredReplicas": 1}, pods(1, 30.0, **OVERLOAD), 1000.0)
    decision = plan.decision
    assert decision.scaling is not None
    assert decision.replicas_before == 1 and decision.desired == 3 and decision.is_replica_news
    assert decision.scaling.reason == "up-forecast"
    text = decision.replica_change_text()
    assert text.startswith("up-forecast: replicas 1 -> 3 (forecast 20.00 req/s, capacity ")
    assert "pause budget 0, backlog 30" in text
    assert status["desiredReplicas"] == 3 and status["scaling"]["advisory"] is False
    assert (
        status["scaling"]["lastChange"]["from"] == 1 and status["scaling"]["lastChange"]["to"] == 3
    )
    inputs = status["scaling"]["inputs"]
    assert inputs["forecast"] == 20.0 and inputs["backlog"] == 30 and inputs["pauseBudget"] == 0
    assert inputs["forecastReplicas"] >= 3 and inputs["capacityPerReplica"] > 0
    events = [(e.reason, e.message) for e in round_events(plan, ONE)]
    assert ("ScaledUp", text) in events


def test_waiters_the_pause_budget_admits_buy_nothing_and_a_backlog_beyond_it_does() -> None:
    spec = auto_spec()
    settled = {"desiredReplicas": 2, "scaling": {"state": {"estimates": {
        "level": 10.0, "serviceSeconds": 0.6, "ready": 2, "calmRounds": 3}}}}  # fmt: skip
    absorbed, status = run_round(spec, settled, pods(2, 30.0, waiters=2, pause_budget=2), 1000.0)
    assert absorbed.decision.scaling is not None
    assert absorbed.decision.desired == 2 and not absorbed.decision.scaling.reason.startswith("up")
    assert status["scaling"]["inputs"]["backlog"] == 0
    queued, status = run_round(spec, settled, pods(2, 30.0, waiters=600, pause_budget=2), 1000.0)
    assert queued.decision.scaling is not None
    assert (queued.decision.desired, queued.decision.scaling.reason) == (3, "up-backlog")
    assert status["scaling"]["inputs"]["backlog"] == 2 * (600 - 2)


def test_rounds_that_are_not_due_leave_the_replicas_and_the_status() -> None:
    spec = auto_spec()
    status = {"desiredReplicas": 2}
    wake = plan_round(spec, status, pods(2, 30.0, **OVERLOAD), now=1000.0, num_ready=2,
                      is_deciding=False)  # fmt: skip
    assert wake.decision.scaling is None and wake.decision.desired == 2
    assert not wake.decision.is_replica_news and history_entry(wake.decision, "T") is None
    assert scaling_status(wake.decision, {"reason": "hold"}, "T") == {}
    patch = status_patch(spec, wake, ONE, status, observed_generation=1, now_text="T")
    assert "desiredReplicas" not in patch and "scaling" not in patch
    # The wake-up round did not count the window: the next deciding round scales on it.
    due = plan_round(spec, status, pods(2, 30.0, **OVERLOAD), now=1000.5, num_ready=2)
    assert due.decision.scaling is not None and due.decision.desired == 3
    # A deciding round with no new window (and not stale yet) is not due either.
    _, after = run_round(spec, status, pods(2, 30.0), 1000.0)
    early, _ = run_round(spec, after, pods(2, 30.0, **OVERLOAD), 1005.0)
    assert early.decision.scaling is None and early.decision.desired == 2
    manual = GenPoolSpec.from_body({"replicas": 2})
    off, _ = run_round(manual, {}, pods(2, 30.0, **OVERLOAD), 1000.0)
    assert off.decision.scaling is None and off.decision.desired == 2


def test_stale_stats_give_the_scaler_stats_missing_and_restart_its_window() -> None:
    spec = auto_spec()
    _, status = run_round(spec, {"desiredReplicas": 2}, pods(2, 30.0, **QUIET), 1000.0)
    assert len(status["scaling"]["state"]["recommendations"]) == 1
    stale, status = run_round(spec, status, pods(2, 30.0, **QUIET), 1021.0)
    assert stale.decision.is_stale and stale.decision.scaling is not None
    assert (stale.decision.desired, stale.decision.scaling.reason) == (2, "stats-missing")
    state = status["scaling"]["state"]
    assert state["recommendations"] == [] and state["estimates"]["level"] is not None
    assert not stale.decision.is_replica_news


def test_scale_down_waits_for_the_window_restored_from_status() -> None:
    # Rounds come every interval plus their own time: the window still closes.
    seen, status = run_rounds(
        auto_spec(), {"desiredReplicas": 3}, (1000.3, 1010.9, 1021.4), 3, **QUIET
    )
    assert seen[0] == (3, "hold-down-window") and seen[1] == (3, "hold-down-window")
    assert seen[2] == (1, "down-consolidate")
    assert status["desiredReplicas"] == 1


def test_the_down_window_is_rounded_up_to_whole_intervals() -> None:
    # 25 s at a 10 s interval is 30 s: down on the fourth round, not the third.
    spec = autoscaling_spec(scaleDownStabilizationSeconds=25)
    seen, _ = run_rounds(spec, {"desiredReplicas": 3}, (1000.0, 1010.0, 1020.0, 1030.0), 3, **QUIET)
    assert [n for n, _ in seen] == [3, 3, 3, 1]
    assert seen[2][1] == "hold-down-window"


def test_scale_up_window_holds_until_every_recommendation_agrees() -> None:
    spec = autoscaling_spec(scaleUpStabilizationSeconds=20)
    seen, status = run_rounds(spec, {"desiredReplicas": 1}, (1000.0, 1010.4, 1020.9), 1, **OVERLOAD)
    assert seen[0] == (1, "hold-up-window") and seen[1] == (1, "hold-up-window")
    assert seen[2][0] == 3 and status["desiredReplicas"] == 3
    # Without the window the same overload scales at once.
    now, _ = run_rounds(auto_spec(), {"desiredReplicas": 1}, (1000.0,), 1, **OVERLOAD)
    assert now[0][0] == 3


def test_advisory_decides_relative_to_what_runs_and_reports_changed_advice_once() -> None:
    spec = auto_spec(advisory=True)
    first, status = run_round(spec, {}, pods(1, 30.0, **OVERLOAD), 1000.0)
    assert first.decision.desired == 3 and first.decision.is_replica_news
    assert first.decision.replica_change_text().startswith("advisory, not applied: ")
    assert status["desiredReplicas"] == 3 and status["scaling"]["advisory"] is True
    entry = history_entry(first.decision, "T")
    assert entry is not None and entry["advisory"] is True
    assert [e.reason for e in round_events(first, ONE)].count("ScaledUp") == 1
    again, status = run_round(spec, status, pods(1, 40.0, **OVERLOAD), 1010.0)
    assert again.decision.replicas_before == 1  # what runs: spec.replicas
    assert again.decision.desired == 3 and not again.decision.is_replica_news
    assert history_entry(again.decision, "T") is None
    assert "ScaledUp" not in [e.reason for e in round_events(again, ONE)]
    assert [e["kind"] for e in status["tuning"]["history"]] == ["Replicas"]  # the advice, once


def test_advisory_knobs_are_recorded_not_pushed() -> None:
    spec = auto_spec(advisory=True)
    plan = plan_round(spec, {"tuning": PENDING_RAISE}, {"p": [LINE]}, now=0.0, num_ready=1)
    tuning = plan.decision.tuning
    assert tuning is not None and tuning.changed
    assert plan.knobs == plan.decision.knobs_before and plan.live["paused_cap"] == 6  # not applied
    assert plan.decision.state.knobs == plan.decision.knobs_before  # nor kept as in force
    patch = status_patch(spec, plan, ONE, {}, observed_generation=1, now_text="T0")
    assert patch["tuning"]["pausedCap"] == 6 and patch["tuning"]["lastChange"]["advisory"]
    assert patch["tuning"]["history"][-1]["advisory"] is True
    tuned = [e for e in round_events(plan, ONE) if e.reason == "Tuned"]
    assert tuned[0].message.startswith("advisory, not applied: raise-cap-budget-unspent")


def test_no_reporting_worker_means_stale_stats_at_once() -> None:
    plan = plan_round(auto_spec(), {}, {}, now=0.0, num_ready=2)
    assert plan.decision.stats is None
    patch = status_patch(
        auto_spec(), plan, PushOutcome(0, 2), {}, observed_generation=1, now_text="T"
    )
    stale = next(c for c in patch["conditions"] if c["type"] == "StatsStale")
    assert (stale["status"], stale["reason"]) == ("True", "NoWorkersReporting")
    assert stale["message"] == "0 of 2 ready workers report a stat line"


def test_turning_autoscaling_off_clears_the_scalers_status() -> None:
    manual = GenPoolSpec.from_body({"replicas": 2})
    plan = plan_round(manual, {}, {"p": [LINE]}, now=0.0, num_ready=1)
    status = {"desiredReplicas": 3, "scaling": {"reason": "hold"}}
    patch = status_patch(manual, plan, ONE, status, observed_generation=1, now_text="T0")
    assert patch["desiredReplicas"] is None and patch["scaling"] is None
    after = apply_patch(status, patch)
    assert "desiredReplicas" not in after and "scaling" not in after
    assert "desiredReplicas" not in status_patch(
        manual, plan, ONE, {}, observed_generation=1, now_text="T0"
    )


def test_the_controller_state_round_trips_through_the_status() -> None:
    spec = auto_spec()
    status: dict[str, Any] = {"desiredReplicas": 1, "tuning": {**PENDING_RAISE}}
    lines = {"a": [replace(LINE, **OVERLOAD)], "b": [statline(30.0, **OVERLOAD)]}
    plan, status = run_round(spec, status, lines, 1000.25, num_ready=1)
    state = plan.decision.state
    # Every part of it carries something, so a lost part would show.
    assert state.knobs is not None and state.knobs != Knobs(6, 6)  # the status's
    assert state.tuner.cooldown_remaining > 0
    assert state.scaler.recommendations and state.scaler.estimates.level == 40.0  # 2 x 20/s
    assert state.scaler.estimates.service_s is not None
    assert state.windows.last_t == {"a": 30.0, "b": 30.0} and state.windows.entered_at == 1000.25
    assert state.replicas == 3
    assert controller_state(spec, status) == state
    # And once more after a round that holds.
    lines = {"a": [replace(LINE, t=40.0, **OVERLOAD)], "b": [statline(40.0, **OVERLOAD)]}
    plan, status = run_round(spec, status, lines, 1010.5, num_ready=3)
    assert len(plan.decision.state.scaler.recommendations) == 2
    assert controller_state(spec, status) == plan.decision.state
