"""The stats round's decisions, pure: freshness, knobs in force, the tuner's turn, the
live config and its generation, the status patch, conditions and events."""

from __future__ import annotations

from typing import Any

from bench.fake_workers import STATLINE
from genpool_core import tuner
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.names import DEFAULT_STAT_INTERVAL_S
from genpool_core.statline import StatLine, parse_statline
from genpool_operator.freshness import LineClock, observe
from genpool_operator.round_plan import (
    HISTORY_LIMIT,
    PushOutcome,
    RoundPlan,
    desired_generation,
    knobs_in_force,
    live_config,
    plan_round,
    round_events,
    round_interval,
    status_patch,
    tuning_record,
)
from genpool_operator.spec import GenPoolSpec

SLO_SPEC = {"preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8}}
# The fake line proposes raise-cap-budget-unspent (below-T 0.115 under eps - dead band,
# the cap turned over, a waiter at risk); a second round in a row confirms it.
PENDING_RAISE = {
    "residentHeadroom": 6,
    "pausedCap": 6,
    "pendingReason": "raise-cap-budget-unspent",
    "pendingRounds": 1,
}
SYNCED = PushOutcome(2, 2)


def _line(t: float) -> StatLine:
    line = parse_statline(STATLINE.format(t=t))
    assert line is not None
    return line


LINE = _line(30.0)


def _observe(seen: LineClock, lines: dict[str, StatLine], now: float) -> tuple[LineClock, Any]:
    fresh = observe(seen, lines, now=now, interval=10.0)
    return fresh.seen, (fresh.is_stale, fresh.has_advanced)


def test_freshness_stale_after_two_intervals_without_a_new_line() -> None:
    seen, flags = _observe(LineClock(), {"p": LINE}, now=0.0)
    assert flags == (False, True)
    seen, flags = _observe(seen, {"p": LINE}, now=15.0)
    assert flags == (False, False)
    seen, flags = _observe(seen, {"p": LINE}, now=21.0)
    assert flags == (True, False)
    seen, flags = _observe(seen, {"p": _line(60.0)}, now=22.0)
    assert flags == (False, True)


def test_no_reporting_pods_turn_stale_only_after_the_grace() -> None:
    seen, flags = _observe(LineClock(), {}, now=100.0)
    assert flags == (False, False)
    assert _observe(seen, {}, now=121.0)[1] == (True, False)


def test_observe_leaves_the_old_clock_alone() -> None:
    seen = LineClock()
    after = observe(seen, {"p": LINE}, now=5.0, interval=10.0).seen
    assert seen == LineClock() and after.last_t == {"p": 30.0} and after.started_at == 5.0


def test_generation_moves_only_when_live_values_change() -> None:
    live = {"resident_headroom": 6, "paused_cap": 6}
    assert desired_generation({}, live) == 1
    assert desired_generation({"appliedGeneration": 3, "liveConfig": live}, live) == 3
    assert desired_generation({"appliedGeneration": 3, "liveConfig": live}, {**live, "x": 1}) == 4


def test_knobs_in_force_prefer_status_and_clamp_to_spec_bounds() -> None:
    spec = GenPoolSpec.from_body(
        {**SLO_SPEC, "tuning": {"residentHeadroom": {"max": 8}, "pausedCap": {"max": 8}}}
    )
    assert knobs_in_force(spec, {}) == spec.start_knobs()
    status = {"residentHeadroom": 50, "pausedCap": 40}
    assert knobs_in_force(spec, status) == Knobs(8, 8)
    off = GenPoolSpec.from_body({})
    assert knobs_in_force(off, status) == Knobs(0, 0)


def test_knobs_in_force_ignore_hand_edited_garbage() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    status = {"residentHeadroom": "lots", "pausedCap": float("nan")}
    assert knobs_in_force(spec, status) == spec.start_knobs() == Knobs(6, 6)


def test_live_config_carries_knobs_and_the_specs_live_fields() -> None:
    spec = GenPoolSpec.from_body({**SLO_SPEC, "preemption": {**SLO_SPEC["preemption"]}})
    live = live_config(spec, Knobs(5, 3))
    assert live["resident_headroom"] == 5 and live["paused_cap"] == 3
    assert live["slack_s"] == 0.5
    assert live["admission_target_min_s"] == 0.25 and live["admission_target_max_s"] == 30.0


def _plan(decision: tuner.Decision | None) -> RoundPlan:
    before = Knobs(6, 4)
    bounds = KnobBounds(0, 16, 0, 16)
    return RoundPlan(LineClock(), None, False, decision, before, bounds, {"paused_cap": 4}, 2)


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
    assert len(record["history"]) == HISTORY_LIMIT
    assert record["history"][-1]["to"] == {"residentHeadroom": 8, "pausedCap": 6}
    assert record["lastChange"]["from"] == {"residentHeadroom": 6, "pausedCap": 4}
    assert record["residentHeadroom"] == 8 and record["pausedCap"] == 6
    text = _plan(changed).change_text()
    assert text == "raise-cap: headroom 6 -> 8, cap 4 -> 6"


def test_the_interval_is_the_specs_or_the_crd_default() -> None:
    spec = GenPoolSpec.from_body({"tuning": {"intervalSeconds": 7}})
    assert round_interval(spec) == 7.0
    assert round_interval(GenPoolSpec.from_body({})) == float(DEFAULT_STAT_INTERVAL_S) == 30.0
    assert round_interval(None) == 30.0


def test_a_confirmed_proposal_changes_the_knobs_pushes_them_and_says_so() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    plan = plan_round(spec, PENDING_RAISE, {"p": LINE}, LineClock(), now=0.0, tune=True)
    assert plan.decision is not None and plan.decision.changed
    assert plan.knobs_before == Knobs(6, 6) and plan.knobs == Knobs(8, 8)
    assert plan.live["resident_headroom"] == 8 and plan.live["paused_cap"] == 8
    assert plan.generation == 1 and plan.seen.last_t == {"p": 30.0}
    events = round_events(plan, SYNCED)
    assert [(e.type, e.reason) for e in events] == [("Normal", "Tuned")]
    assert events[0].message == "raise-cap-budget-unspent: headroom 6 -> 8, cap 6 -> 8"


def test_the_first_sighting_of_a_proposal_only_remembers_it() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    status = {"residentHeadroom": 6, "pausedCap": 6}
    plan = plan_round(spec, status, {"p": LINE}, LineClock(), now=0.0, tune=True)
    assert plan.decision is not None and plan.decision.reason == "hold-hysteresis"
    assert plan.knobs == Knobs(6, 6) and round_events(plan, SYNCED) == []
    record = status_patch(plan, SYNCED, {}, observed_generation=3, now_text="T0")["tuning"]
    assert record["pendingReason"] == "raise-cap-budget-unspent" and record["pendingRounds"] == 1


def test_a_round_without_tuning_pushes_the_knobs_in_force() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    plan = plan_round(spec, PENDING_RAISE, {"p": LINE}, LineClock(), now=0.0, tune=False)
    assert plan.decision is None and plan.knobs == Knobs(6, 6)
    assert plan.live["paused_cap"] == 6 and plan.seen.last_t == {"p": 30.0}


def test_the_tuner_skips_a_line_it_has_seen_and_rounds_with_preemption_off() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    seen = observe(LineClock(), {"p": LINE}, now=0.0, interval=30.0).seen
    again = plan_round(spec, PENDING_RAISE, {"p": LINE}, seen, now=10.0, tune=True)
    assert again.decision is None
    off = plan_round(GenPoolSpec.from_body({}), {}, {"p": LINE}, LineClock(), now=0, tune=True)
    assert off.decision is None and off.knobs == Knobs(0, 0)
    disabled = GenPoolSpec.from_body({**SLO_SPEC, "tuning": {"enabled": False}})
    plan = plan_round(disabled, PENDING_RAISE, {"p": LINE}, LineClock(), now=0.0, tune=True)
    assert plan.decision is None


def test_stale_stats_freeze_the_knobs_and_keep_the_old_preemption_status() -> None:
    spec = GenPoolSpec.from_body({**SLO_SPEC, "tuning": {"intervalSeconds": 10}})
    seen = observe(LineClock(), {"p": LINE}, now=0.0, interval=10.0).seen
    plan = plan_round(spec, PENDING_RAISE, {"p": LINE}, seen, now=21.0, tune=True)
    assert plan.is_stale and plan.decision is not None
    assert plan.decision.reason == "stats-stale" and not plan.decision.changed
    patch = status_patch(plan, SYNCED, {}, observed_generation=1, now_text="T1")
    assert "preemption" not in patch and "statsUpdatedAt" not in patch
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert conditions["StatsStale"]["status"] == "True"
    assert conditions["StatsStale"]["reason"] == "NoFreshStatLines"


def test_status_patch_records_stats_sync_and_conditions() -> None:
    spec = GenPoolSpec.from_body(SLO_SPEC)
    plan = plan_round(spec, PENDING_RAISE, {"p": LINE}, LineClock(), now=0.0, tune=True)
    push = PushOutcome(1, 2, {"p2": "HTTP 500: boom"})
    old = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "T-1"}]}
    patch = status_patch(plan, push, old, observed_generation=4, now_text="T0")
    assert patch["workersReporting"] == 1 and patch["statsUpdatedAt"] == "T0"
    assert patch["preemption"]["paused"] == 4 and patch["preemption"]["waiters"] == 3
    assert patch["tuning"]["podsInSync"] == "1/2" and patch["tuning"]["appliedGeneration"] == 1
    assert patch["tuning"]["liveConfig"] == plan.live
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert conditions["Ready"]["lastTransitionTime"] == "T-1"  # not ours: left alone
    assert conditions["TuningInSync"]["status"] == "False"
    assert conditions["TuningInSync"]["message"] == "p2: HTTP 500: boom"
    assert conditions["TuningInSync"]["observedGeneration"] == 4
    assert conditions["HeadroomAtBound"]["message"] == "headroom 8 of max 16"
    assert conditions["StatsStale"]["status"] == "False"
    warnings = [e for e in round_events(plan, push) if e.type == "Warning"]
    assert [(e.reason, e.message) for e in warnings] == [("ConfigPushFailed", "p2: HTTP 500: boom")]


def test_in_sync_pods_and_headroom_at_its_max_show_in_conditions() -> None:
    spec = GenPoolSpec.from_body({**SLO_SPEC, "tuning": {"residentHeadroom": {"max": 6}}})
    plan = plan_round(spec, {}, {}, LineClock(), now=0.0, tune=False)
    patch = status_patch(plan, PushOutcome(0, 0), {}, observed_generation=None, now_text="T0")
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert conditions["TuningInSync"]["message"] == "0/0 pods at generation 1"
    assert conditions["HeadroomAtBound"]["status"] == "True"
    assert "observedGeneration" not in conditions["HeadroomAtBound"]
    assert patch["workersReporting"] == 0 and "preemption" not in patch


def test_push_failure_detail_is_truncated_for_the_event() -> None:
    errors = {f"pod-{i:03d}": "x" * 50 for i in range(40)}
    events = round_events(_plan(None), PushOutcome(0, 40, errors))
    assert len(events) == 1 and len(events[0].message) == 1000
