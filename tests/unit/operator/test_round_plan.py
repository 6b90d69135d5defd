"""The stats round's decisions, pure: windows and staleness, knobs in force, the tuner's
turn, the live config and its generation, the status patch, conditions and events.

The controller's state is a value that round-trips through the GenPool's status: a
round's :func:`status_patch` is applied to a status dict (:func:`apply_patch`) and the
next round reads it back, as the operator does through the apiserver."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from genpool_core import tuner
from genpool_core.controller import ControllerState, RoundDecision
from genpool_core.knobs import Knobs
from genpool_core.live import LiveUpdate
from genpool_core.names import DEFAULT_STAT_INTERVAL_S
from genpool_core.slo_check import NO_MEASURE
from genpool_core.statline import StatLine
from genpool_operator.round_plan import (
    HISTORY_LIMIT,
    PushOutcome,
    RoundPlan,
    controller_state,
    desired_generation,
    live_config,
    plan_round,
    round_events,
    round_interval,
    status_patch,
    tuning_record,
)
from genpool_operator.spec import GenPoolSpec
from tests.unit.operator.rounds import LINE, PENDING_RAISE, apply_patch, fake_line

SLO_SPEC = {"preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8}}
FAST_SPEC = {**SLO_SPEC, "tuning": {"intervalSeconds": 10}}  # stale after 20 s
SYNCED = PushOutcome(2, 2)


def run(
    spec: GenPoolSpec,
    status: Mapping[str, Any],
    lines: Mapping[str, Sequence[StatLine]],
    *,
    now: float,
    num_ready: int = 1,
    is_deciding: bool = True,
    push: PushOutcome = SYNCED,
) -> tuple[RoundPlan, dict[str, Any]]:
    """One round: its plan and the status after its patch."""
    plan = plan_round(spec, status, lines, now=now, num_ready=num_ready, is_deciding=is_deciding)
    patch = status_patch(spec, plan, push, status, observed_generation=1, now_text=f"T{now:g}")
    return plan, apply_patch(status, patch)


def test_stale_after_two_intervals_without_a_new_window() -> None:
    spec = GenPoolSpec.from_body(FAST_SPEC)
    first, status = run(spec, {}, {"p": [LINE]}, now=0.0)
    assert not first.decision.is_stale and first.decision.tuning is not None
    early, status = run(spec, status, {"p": [LINE]}, now=15.0)
    assert not early.decision.is_stale and early.decision.tuning is None  # nothing new
    stale, status = run(spec, status, {"p": [LINE]}, now=21.0)
    assert stale.decision.is_stale and stale.decision.tuning is not None
    assert stale.decision.tuning.reason == "stats-stale"
    moved, _ = run(spec, status, {"p": [LINE, fake_line(60.0)]}, now=22.0)
    assert not moved.decision.is_stale and moved.decision.tuning is not None
    assert moved.decision.tuning.reason != "stats-stale"


def test_no_reporting_pods_turn_stale_only_after_the_grace() -> None:
    spec = GenPoolSpec.from_body(FAST_SPEC)
    first, status = run(spec, {}, {}, now=100.0, num_ready=0)
    assert not first.decision.is_stale and first.decision.stats is None
    assert status["statWindows"]["startedAt"] == 100.0  # the grace survives a restart
    later, _ = run(spec, status, {}, now=121.0, num_ready=0)
    assert later.decision.is_stale


def test_a_round_leaves_the_status_it_read_alone() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    status: dict[str, Any] = {"tuning": dict(PENDING_RAISE)}
    before = json.loads(json.dumps(status))
    plan = plan_round(spec, status, {"p": [LINE]}, now=5.0, num_ready=1)
    status_patch(spec, plan, SYNCED, status, observed_generation=1, now_text="T5")
    assert status == before
    windows = plan.decision.state.windows
    assert windows.last_t == {"p": 30.0} and windows.started_at == 5.0
    assert windows.entered_at == 5.0


def test_generation_moves_only_when_live_values_change() -> None:
    live = {"resident_headroom": 6, "paused_cap": 6}
    assert desired_generation({}, live) == 1
    assert desired_generation({"appliedGeneration": 3, "liveConfig": live}, live) == 3
    assert desired_generation({"appliedGeneration": 3, "liveConfig": live}, {**live, "x": 1}) == 4


def _knobs_in_force(spec: GenPoolSpec, status: Mapping[str, Any]) -> Knobs:
    """The knobs a wake-up round pushes: the ones in force, untouched by the tuner."""
    plan = plan_round(spec, status, {}, now=0.0, num_ready=0, is_deciding=False)
    assert plan.decision.tuning is None and plan.knobs == plan.decision.knobs_before
    assert (plan.live["resident_headroom"], plan.live["paused_cap"]) == (
        plan.knobs.resident_headroom,
        plan.knobs.paused_cap,
    )
    return plan.knobs


def test_knobs_in_force_prefer_status_and_clamp_to_spec_bounds() -> None:
    spec = GenPoolSpec.from_body(
        {**SLO_SPEC, "tuning": {"residentHeadroom": {"max": 8}, "pausedCap": {"max": 8}}}
    )
    assert _knobs_in_force(spec, {}) == spec.start_knobs()
    assert _knobs_in_force(spec, {"tuning": {"residentHeadroom": 7, "pausedCap": 5}}) == Knobs(7, 5)
    status = {"tuning": {"residentHeadroom": 50, "pausedCap": 40}}
    assert _knobs_in_force(spec, status) == Knobs(8, 8)
    off = GenPoolSpec.from_body({})
    assert _knobs_in_force(off, status) == Knobs(0, 0)
    assert controller_state(off, status).knobs is None  # no pausing: no knobs to keep


def test_knobs_in_force_ignore_hand_edited_garbage() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    status = {"tuning": {"residentHeadroom": "lots", "pausedCap": float("nan")}}
    assert _knobs_in_force(spec, status) == spec.start_knobs() == Knobs(16, 16)  # A
    garbage = {
        "tuning": {"residentHeadroom": True, "pendingRounds": "x", "cooldownRemaining": -3},
        "scaling": {
            "state": {"recommendations": "x", "estimates": {"capacity": 7, "level": "soon"}}
        },
        "statWindows": {"lastWindowEnd": {"p": "x"}, "enteredAt": True, "startedAt": None},
        "desiredReplicas": "2",
    }
    assert controller_state(spec, garbage) == ControllerState(knobs=Knobs(16, 16))


def test_live_config_carries_knobs_and_the_specs_live_fields() -> None:
    spec = GenPoolSpec.from_body({**SLO_SPEC, "preemption": {**SLO_SPEC["preemption"]}})
    live = live_config(spec, Knobs(5, 3))
    assert live["resident_headroom"] == 5 and live["paused_cap"] == 3
    assert live["slack_s"] == 0.5
    assert live["admission_target_min_s"] == 0.25 and live["admission_target_max_s"] == 30.0


def _plan(tuning: tuner.Decision | None, *, is_advisory: bool = False) -> RoundPlan:
    decision = RoundDecision(
        state=ControllerState(), stats=None, is_stale=False, knobs_before=Knobs(6, 4),
        tuning=tuning, replicas_before=1, scaling=None, slo=NO_MEASURE, verdict=None,
        is_advisory=is_advisory,
    )  # fmt: skip
    return RoundPlan(decision, LiveUpdate(generation=2, paused_cap=4))


def test_tuning_record_appends_bounded_history_on_changes_only() -> None:
    before = Knobs(6, 4)
    state = tuner.TunerState()
    push = PushOutcome(1, 2, {"p": "HTTP 500"})
    held = tuner.Decision(before, "hold", False, state)
    record = tuning_record({}, _plan(held), push, "T0")
    assert "history" not in record and record["podsInSync"] == "1/2"
    assert record["appliedGeneration"] == 2 and record["lastReason"] == "hold"
    changed = tuner.Decision(Knobs(8, 6), "raise-cap", True, state)
    history = [{"time": str(i)} for i in range(HISTORY_LIMIT)]
    record = tuning_record({"history": history}, _plan(changed), push, "T1")
    assert HISTORY_LIMIT == 10 and len(record["history"]) == HISTORY_LIMIT
    assert record["history"][0] == {"time": "1"}  # the oldest gave way
    assert record["history"][-1]["to"] == {"residentHeadroom": 8, "pausedCap": 6}
    assert record["lastChange"]["from"] == {"residentHeadroom": 6, "pausedCap": 4}
    assert record["residentHeadroom"] == 8 and record["pausedCap"] == 6
    text = _plan(changed).decision.knob_change_text()
    assert text == "raise-cap: headroom 6 -> 8, cap 4 -> 6"
    advice = _plan(changed, is_advisory=True)
    assert advice.decision.knob_change_text() == f"advisory, not applied: {text}"


def test_the_interval_is_the_specs_or_the_crd_default() -> None:
    spec = GenPoolSpec.from_body({"tuning": {"intervalSeconds": 7}})
    assert round_interval(spec) == 7.0
    assert round_interval(GenPoolSpec.from_body({})) == float(DEFAULT_STAT_INTERVAL_S) == 30.0
    assert round_interval(None) == 30.0


def test_a_confirmed_proposal_changes_the_knobs_pushes_them_and_says_so() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    plan = plan_round(spec, {"tuning": PENDING_RAISE}, {"p": [LINE]}, now=0.0, num_ready=1)
    tuning = plan.decision.tuning
    assert tuning is not None and tuning.changed
    assert plan.decision.knobs_before == Knobs(6, 6) and plan.knobs == Knobs(8, 8)
    assert plan.live["resident_headroom"] == 8 and plan.live["paused_cap"] == 8
    assert plan.generation == 1 and plan.decision.state.windows.last_t == {"p": 30.0}
    assert plan.decision.state.knobs == Knobs(8, 8)
    events = round_events(plan, SYNCED)
    assert [(e.type, e.reason) for e in events] == [("Normal", "Tuned")]
    assert events[0].message == "raise-cap-budget-unspent: headroom 6 -> 8, cap 6 -> 8"


def test_the_first_sighting_of_a_proposal_only_remembers_it() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    status = {"tuning": {"residentHeadroom": 6, "pausedCap": 6}}
    plan, after = run(spec, status, {"p": [LINE]}, now=0.0)
    tuning = plan.decision.tuning
    assert tuning is not None and tuning.reason == "hold-hysteresis"
    assert plan.knobs == Knobs(6, 6) and round_events(plan, SYNCED) == []
    record = after["tuning"]
    assert record["pendingReason"] == "raise-cap-budget-unspent" and record["pendingRounds"] == 1
    # The next window confirms it: the proposal came back through the status.
    confirmed, _ = run(spec, after, {"p": [LINE, fake_line(60.0)]}, now=30.0)
    assert confirmed.decision.tuning is not None and confirmed.decision.tuning.changed
    assert confirmed.knobs == Knobs(8, 8)


def test_a_wake_up_round_pushes_the_knobs_in_force_and_leaves_the_window_uncounted() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    status = {"tuning": PENDING_RAISE}
    plan, after = run(spec, status, {"p": [LINE]}, now=0.0, is_deciding=False)
    assert plan.decision.tuning is None and plan.knobs == Knobs(6, 6)
    assert plan.live["paused_cap"] == 6 and plan.generation == 1
    assert plan.decision.state.windows == controller_state(spec, status).windows  # not advanced
    assert after["tuning"]["pendingRounds"] == 1  # the tuner's state is untouched
    # The next deciding round still counts the window the wake-up round saw.
    tuned, _ = run(spec, after, {"p": [LINE]}, now=1.0)
    assert tuned.decision.tuning is not None and tuned.decision.tuning.changed
    assert tuned.decision.stats is not None and tuned.decision.stats.completed_window == 180


def test_the_tuner_skips_a_window_it_has_counted_and_rounds_with_preemption_off() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    _, status = run(spec, {"tuning": {"residentHeadroom": 6, "pausedCap": 6}}, {"p": [LINE]}, now=0)
    again, _ = run(spec, {**status, "tuning": PENDING_RAISE}, {"p": [LINE]}, now=10.0)
    assert again.decision.tuning is None and again.knobs == Knobs(6, 6)
    off, _ = run(GenPoolSpec.from_body({}), {}, {"p": [LINE]}, now=0.0)
    assert off.decision.tuning is None and off.knobs == Knobs(0, 0)
    disabled = GenPoolSpec.from_body({**SLO_SPEC, "tuning": {"enabled": False}})
    plan, _ = run(disabled, {"tuning": PENDING_RAISE}, {"p": [LINE]}, now=0.0)
    assert plan.decision.tuning is None and plan.knobs == Knobs(6, 6)


def test_stale_stats_freeze_the_knobs_and_keep_the_old_preemption_status() -> None:
    spec = GenPoolSpec.from_body(FAST_SPEC)
    _, status = run(spec, {}, {"p": [LINE]}, now=0.0)
    status = {**status, "tuning": {**status["tuning"], **PENDING_RAISE}}
    plan, after = run(spec, status, {"p": [LINE]}, now=21.0)
    tuning = plan.decision.tuning
    assert plan.decision.is_stale and tuning is not None
    assert tuning.reason == "stats-stale" and not tuning.changed and plan.knobs == Knobs(6, 6)
    patch = status_patch(spec, plan, SYNCED, {}, observed_generation=1, now_text="T1")
    assert "preemption" not in patch and "statsUpdatedAt" not in patch and "slo" not in patch
    assert after["statsUpdatedAt"] == "T0"  # the last fresh round's stays
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert conditions["StatsStale"]["status"] == "True"
    assert conditions["StatsStale"]["reason"] == "NoFreshStatLines"
    assert conditions["StatsStale"]["message"] == "1 workers reporting"


def test_status_patch_records_stats_windows_sync_and_conditions() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    plan = plan_round(spec, {"tuning": PENDING_RAISE}, {"p": [LINE]}, now=0.0, num_ready=2)
    push = PushOutcome(1, 2, {"p2": "HTTP 500: boom"})
    old = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "T-1"}]}
    patch = status_patch(spec, plan, push, old, observed_generation=4, now_text="T0")
    assert patch["workersReporting"] == 1 and patch["statsUpdatedAt"] == "T0"
    assert patch["preemption"]["paused"] == 4 and patch["preemption"]["waiters"] == 3
    assert patch["tuning"]["podsInSync"] == "1/2" and patch["tuning"]["appliedGeneration"] == 1
    assert patch["tuning"]["liveConfig"] == plan.live
    assert patch["statWindows"] == {
        "lastWindowEnd": {"p": 30.0},
        "enteredAt": 0.0,
        "startedAt": 0.0,
    }
    assert "desiredReplicas" not in patch and "scaling" not in patch  # autoscaling off
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert conditions["Ready"]["lastTransitionTime"] == "T-1"  # not ours: left alone
    assert conditions["TuningInSync"]["status"] == "False"
    assert conditions["TuningInSync"]["message"] == "p2: HTTP 500: boom"
    assert conditions["TuningInSync"]["observedGeneration"] == 4
    assert conditions["HeadroomAtBound"]["message"] == "headroom 8 of max 16"
    assert conditions["StatsStale"]["status"] == "False"
    assert conditions["StatsStale"]["reason"] == "StatLinesFresh"
    warnings = [e for e in round_events(plan, push) if e.type == "Warning"]
    assert [(e.reason, e.message) for e in warnings] == [("ConfigPushFailed", "p2: HTTP 500: boom")]


def test_in_sync_pods_and_headroom_at_its_max_show_in_conditions() -> None:
    spec = GenPoolSpec.from_body({**SLO_SPEC, "tuning": {"residentHeadroom": {"max": 6}}})
    plan = plan_round(spec, {}, {}, now=0.0, num_ready=0, is_deciding=False)
    patch = status_patch(spec, plan, PushOutcome(0, 0), {}, observed_generation=None, now_text="T")
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert conditions["TuningInSync"]["status"] == "True"
    assert conditions["TuningInSync"]["message"] == "0/0 pods at generation 1"
    assert conditions["HeadroomAtBound"]["status"] == "True"
    assert conditions["HeadroomAtBound"]["reason"] == "HeadroomAtMax"
    assert "observedGeneration" not in conditions["HeadroomAtBound"]
    assert patch["workersReporting"] == 0 and "preemption" not in patch


def test_push_failure_detail_is_truncated_for_the_event() -> None:
    errors = {f"pod-{i:03d}": "x" * 50 for i in range(40)}
    events = round_events(_plan(None), PushOutcome(0, 40, errors))
    assert [(e.type, e.reason) for e in events] == [("Warning", "ConfigPushFailed")]
    assert len(events[0].message) == 1000


def test_each_pods_windows_enter_once_through_the_status() -> None:
    spec = GenPoolSpec.from_body(FAST_SPEC)
    # First sighting: only each pod's newest line counts (older ones predate this controller).
    first, status = run(
        spec, {}, {"a": [LINE], "b": [fake_line(10.0), fake_line(20.0), LINE]}, now=0.0
    )
    assert first.decision.stats is not None and first.decision.stats.completed_window == 2 * 180
    assert status["statWindows"]["lastWindowEnd"] == {"a": 30.0, "b": 30.0}
    # Ten seconds on: "a" did not move, "b" cut two windows since.
    lines = {"a": [LINE], "b": [LINE, fake_line(40.0), fake_line(50.0)]}
    both, status = run(spec, status, lines, now=10.0, num_ready=2)
    stats = both.decision.stats
    assert stats is not None and not both.decision.is_stale
    assert stats.workers_reporting == 2 and stats.num_windows == 2
    assert stats.completed_window == 2 * 180 and stats.paused == 2 * 4  # snapshots: newest each
    assert both.decision.tuning is not None
    assert status["statWindows"]["lastWindowEnd"] == {"a": 30.0, "b": 50.0}
    # Nobody moved: nothing enters, the tuner waits, the stats are not stale yet.
    idle, _ = run(spec, status, lines, now=15.0, num_ready=2)
    assert idle.decision.stats is not None and idle.decision.stats.completed_window == 0
    assert idle.decision.stats.workers_reporting == 2
    assert not idle.decision.is_stale and idle.decision.tuning is None
