"""The replica half of a round: settings from the spec, replicas in force, SLO verdict,
the scaler's call with its stabilisation windows, advisory mode, status and Events.

The scaler's state (its recommendations, ``loadedAt``) and ``desiredReplicas`` live in
the status: each round's patch is applied and read back by the next round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from genpool_core import ttft_histogram
from genpool_core.slo_check import NO_MEASURE, SloTarget, measure_slo, slo_verdict
from genpool_core.statline import StatLine
from genpool_operator.round_plan import (
    PushOutcome,
    RoundPlan,
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
from tests.unit.operator.test_round_plan import LINE, PENDING_RAISE, apply_patch

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
ONE = PushOutcome(1, 1)


def _spec(**overrides: Any) -> GenPoolSpec:
    return GenPoolSpec.from_body({**AUTO, **overrides})


def _auto(**overrides: Any) -> GenPoolSpec:
    return _spec(autoscaling={**AUTO["autoscaling"], **overrides})


def _hist(seconds: float, n: int) -> tuple[int, ...]:
    counts = [0] * ttft_histogram.NUM_BUCKETS
    counts[ttft_histogram.bucket_of(seconds)] = n
    return tuple(counts)


def _statline(t: float, **overrides: Any) -> StatLine:
    """One worker's window at half occupancy, TTFT well inside 1 s."""
    base = StatLine(
        t=t, mode="target_output_tps", residents=4, active=4, paused=0, cap=2, headroom=2,
        waiters=0, completed_window=50, below_target_window=0.05, arrivals_window=50,
        steps_window=500, batch_mean=4.0, ttft_hist=_hist(0.1, 50),
    )  # fmt: skip
    return replace(base, **overrides)


OVERLOAD: dict[str, Any] = {
    "waiters": 30,
    "arrivals_window": 200,
    "batch_mean": 8.0,
    "ttft_hist": _hist(4.0, 60),
}
BURST: dict[str, Any] = {**OVERLOAD, "ttft_hist": _hist(0.1, 60)}  # load alone, SLO holds
QUIET: dict[str, Any] = {"batch_mean": 0.5, "arrivals_window": 20, "completed_window": 20}


def _pods(num: int, t: float, **overrides: Any) -> dict[str, Sequence[StatLine]]:
    return {f"pod-{i}": [_statline(t, **overrides)] for i in range(num)}


def _round(
    spec: GenPoolSpec,
    status: Mapping[str, Any],
    lines: Mapping[str, Sequence[StatLine]],
    now: float,
    *,
    num_ready: int | None = None,
    is_deciding: bool = True,
) -> tuple[RoundPlan, dict[str, Any]]:
    """One round: its plan and the status after its patch (what a restart reads back)."""
    ready = len(lines) if num_ready is None else num_ready
    plan = plan_round(spec, status, lines, now=now, num_ready=ready, is_deciding=is_deciding)
    push = PushOutcome(ready, ready)
    patch = status_patch(spec, plan, push, status, observed_generation=1, now_text=f"T{now:g}")
    return plan, apply_patch(status, patch)


def _rounds(
    spec: GenPoolSpec, status: Mapping[str, Any], times: Sequence[float], num: int, **line: Any
) -> tuple[list[tuple[int, str]], dict[str, Any]]:
    """Deciding rounds at ``times``, each with a new window from ``num`` pods."""
    seen = []
    current = dict(status)
    for i, now in enumerate(times):
        plan, current = _round(spec, current, _pods(num, 30.0 + 10 * i, **line), now)
        scaling = plan.decision.scaling
        assert scaling is not None
        seen.append((plan.decision.desired, scaling.reason))
    return seen, current


def test_settings_come_from_the_spec() -> None:
    settings = scaler_settings(_spec())
    assert (settings.ttft_p90_s, settings.attainment) == (1.0, 0.8)
    assert (settings.min_replicas, settings.max_replicas, settings.max_step) == (1, 3, 2)
    assert settings.max_batch == 8 and settings.down_window_s == 20.0
    assert settings.up_window_s == 0.0 and settings.interval_s == 10.0
    assert scaler_settings(_auto(scaleUpStabilizationSeconds=40)).up_window_s == 40.0
    # The scaler rounds windows up to whole intervals, never shorter than asked.
    odd = scaler_settings(_auto(scaleDownStabilizationSeconds=25))
    assert odd.down_window_s == 25.0 and odd.whole_intervals(odd.down_window_s) == 30.0
    assert settings.cap_max == 8  # the tuner's cap bound: pausing is a lever
    off = scaler_settings(_spec(preemption={"mode": "Off"}))
    assert off.attainment is None and off.cap_max is None  # TTFT alone, no knob lever
    # The shipped ceilings unless the spec names one, which then holds with or without pausing.
    assert (settings.max_utilisation, settings.max_utilisation_with_pausing) == (0.85, 0.95)
    for preemption in (AUTO["preemption"], {"mode": "Off"}):
        ceiling = {**AUTO["autoscaling"], "targetUtilization": 0.6}
        chosen = scaler_settings(_spec(preemption=preemption, autoscaling=ceiling))
        assert (chosen.max_utilisation, chosen.max_utilisation_with_pausing) == (0.6, 0.6)
    assert controller_settings(_spec()).scaler == settings
    assert controller_settings(_spec(autoscaling={"enabled": False})).scaler is None


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, "0.8", True])
def test_a_target_utilization_outside_its_range_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"targetUtilization|target_utilization"):
        _auto(targetUtilization=bad)


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


def test_a_recorded_count_outside_the_bounds_is_clamped_at_once() -> None:
    plan, status = _round(_spec(), {"desiredReplicas": 9}, _pods(3, 30.0, **QUIET), 1000.0)
    assert plan.decision.scaling is not None
    assert (plan.decision.desired, plan.decision.scaling.reason) == (3, "clamp-to-bounds")
    assert status["desiredReplicas"] == 3


def test_overload_scales_up_and_says_so() -> None:
    plan, status = _round(_spec(), {"desiredReplicas": 1}, _pods(1, 30.0, **OVERLOAD), 1000.0)
    decision = plan.decision
    assert decision.scaling is not None
    assert decision.replicas_before == 1 and decision.desired == 3 and decision.is_replica_news
    assert decision.scaling.reason.startswith("up-")
    assert decision.replica_change_text() == f"{decision.scaling.reason}: replicas 1 -> 3"
    assert status["desiredReplicas"] == 3 and status["scaling"]["advisory"] is False
    assert (
        status["scaling"]["lastChange"]["from"] == 1 and status["scaling"]["lastChange"]["to"] == 3
    )
    events = [(e.reason, e.message) for e in round_events(plan, ONE)]
    assert ("ScaledUp", decision.replica_change_text()) in events


def test_a_single_burst_waits_for_a_second_loaded_window_kept_in_status() -> None:
    seen, status = _rounds(_spec(), {"desiredReplicas": 1}, (1000.0, 1010.3), 1, **BURST)
    assert seen[0] == (1, "hold-single-burst") and seen[1][0] == 3
    assert seen[1][1] == "up-arrivals-outrun-completions"
    # A burst that does not come back a window later buys nothing.
    _, status = _round(_spec(), {"desiredReplicas": 1}, _pods(1, 30.0, **BURST), 1000.0)
    assert status["scaling"]["state"]["loadedAt"] == 1000.0
    _, status = _round(_spec(), status, _pods(1, 40.0), 1010.0)
    assert status["scaling"]["state"]["loadedAt"] is None
    again, _ = _round(_spec(), status, _pods(1, 50.0, **BURST), 1020.0)
    assert again.decision.scaling is not None
    assert (again.decision.desired, again.decision.scaling.reason) == (1, "hold-single-burst")


def test_rounds_that_are_not_due_leave_the_replicas_and_the_status() -> None:
    spec = _spec()
    status = {"desiredReplicas": 2}
    wake = plan_round(spec, status, _pods(2, 30.0, **OVERLOAD), now=1000.0, num_ready=2,
                      is_deciding=False)  # fmt: skip
    assert wake.decision.scaling is None and wake.decision.desired == 2
    assert not wake.decision.is_replica_news and history_entry(wake.decision, "T") is None
    assert scaling_status(wake.decision, {"reason": "hold"}, "T") == {}
    patch = status_patch(spec, wake, ONE, status, observed_generation=1, now_text="T")
    assert "desiredReplicas" not in patch and "scaling" not in patch
    # The wake-up round did not count the window: the next deciding round scales on it.
    due = plan_round(spec, status, _pods(2, 30.0, **OVERLOAD), now=1000.5, num_ready=2)
    assert due.decision.scaling is not None and due.decision.desired == 3
    # A deciding round with no new window (and not stale yet) is not due either.
    _, after = _round(spec, status, _pods(2, 30.0), 1000.0)
    early, _ = _round(spec, after, _pods(2, 30.0, **OVERLOAD), 1005.0)
    assert early.decision.scaling is None and early.decision.desired == 2
    manual = GenPoolSpec.from_body({"replicas": 2})
    off, _ = _round(manual, {}, _pods(2, 30.0, **OVERLOAD), 1000.0)
    assert off.decision.scaling is None and off.decision.desired == 2


def test_stale_stats_give_the_scaler_stats_missing_and_restart_its_window() -> None:
    spec = _spec()
    _, status = _round(spec, {"desiredReplicas": 2}, _pods(2, 30.0, **QUIET), 1000.0)
    assert len(status["scaling"]["state"]["recommendations"]) == 1
    stale, status = _round(spec, status, _pods(2, 30.0, **QUIET), 1021.0)
    assert stale.decision.is_stale and stale.decision.scaling is not None
    assert (stale.decision.desired, stale.decision.scaling.reason) == (2, "stats-missing")
    assert status["scaling"]["state"] == {"recommendations": [], "loadedAt": None}
    assert not stale.decision.is_replica_news


def test_scale_down_waits_for_the_window_restored_from_status() -> None:
    # Rounds come every interval plus their own time: the window still closes.
    seen, status = _rounds(_spec(), {"desiredReplicas": 3}, (1000.3, 1010.9, 1021.4), 3, **QUIET)
    assert seen[0] == (3, "hold-down-window") and seen[1] == (3, "hold-down-window")
    assert seen[2] == (1, "down-utilisation-low")
    assert status["desiredReplicas"] == 1


def test_the_down_window_is_rounded_up_to_whole_intervals() -> None:
    # 25 s at a 10 s interval is 30 s: down on the fourth round, not the third.
    spec = _auto(scaleDownStabilizationSeconds=25)
    seen, _ = _rounds(spec, {"desiredReplicas": 3}, (1000.0, 1010.0, 1020.0, 1030.0), 3, **QUIET)
    assert [n for n, _ in seen] == [3, 3, 3, 1]
    assert seen[2][1] == "hold-down-window"


def test_scale_up_window_holds_until_every_recommendation_agrees() -> None:
    spec = _auto(scaleUpStabilizationSeconds=20)
    seen, status = _rounds(spec, {"desiredReplicas": 1}, (1000.0, 1010.4, 1020.9), 1, **OVERLOAD)
    assert seen[0] == (1, "hold-up-window") and seen[1] == (1, "hold-up-window")
    assert seen[2][0] == 3 and status["desiredReplicas"] == 3
    # Without the window the same overload scales at once.
    now, _ = _rounds(_spec(), {"desiredReplicas": 1}, (1000.0,), 1, **OVERLOAD)
    assert now[0][0] == 3


def test_advisory_decides_relative_to_what_runs_and_reports_changed_advice_once() -> None:
    spec = _spec(advisory=True)
    first, status = _round(spec, {}, _pods(1, 30.0, **OVERLOAD), 1000.0)
    assert first.decision.desired == 3 and first.decision.is_replica_news
    assert first.decision.replica_change_text().startswith("advisory, not applied: ")
    assert status["desiredReplicas"] == 3 and status["scaling"]["advisory"] is True
    entry = history_entry(first.decision, "T")
    assert entry is not None and entry["advisory"] is True
    assert [e.reason for e in round_events(first, ONE)].count("ScaledUp") == 1
    again, status = _round(spec, status, _pods(1, 40.0, **OVERLOAD), 1010.0)
    assert again.decision.replicas_before == 1  # what runs: spec.replicas
    assert again.decision.desired == 3 and not again.decision.is_replica_news
    assert history_entry(again.decision, "T") is None
    assert "ScaledUp" not in [e.reason for e in round_events(again, ONE)]
    assert [e["kind"] for e in status["tuning"]["history"]] == ["Replicas"]  # the advice, once


def test_slo_verdict_names_what_misses() -> None:
    assert controller_settings(GenPoolSpec.from_body({})).slo is None
    target = controller_settings(_spec()).slo
    assert target == SloTarget(1.0, 0.8)
    off = controller_settings(_spec(preemption={"mode": "Off"})).slo
    assert off == SloTarget(1.0, None)  # no T, TTFT alone is judged

    def judge(target: SloTarget | None, **line: Any) -> Any:
        assert target is not None
        plan = plan_round(_spec(), {}, _pods(1, 30.0, **line), now=0.0, num_ready=1)
        return slo_verdict(target, plan.decision.slo)

    met = judge(target)
    assert met.is_met and met.reason == "WithinTarget"
    slow = judge(target, ttft_hist=_hist(3.0, 50))
    assert slow.is_met is False and slow.reason == "TTFTAboveTarget"
    lost = judge(target, below_target_window=0.5)
    assert lost.reason == "AttainmentBelowTarget"
    assert "attainment 0.500 (target 0.8)" in lost.message
    assert judge(off, below_target_window=0.5).is_met  # attainment is not judged without T
    unknown = slo_verdict(target, measure_slo(None))
    assert unknown.is_met is None and unknown.reason == "NoSamples"
    assert measure_slo(None) == NO_MEASURE


def test_unknown_slo_keeps_its_transition_time() -> None:
    spec = _spec(autoscaling={"enabled": False})

    def slo_met(status: Mapping[str, Any]) -> tuple[str, str, str]:
        found = next(c for c in status["conditions"] if c["type"] == "SLOMet")
        return found["status"], found["reason"], found["lastTransitionTime"]

    quiet = {"ttft_hist": (), "completed_window": 0}  # no first token in the window
    _, status = _round(spec, {}, _pods(1, 30.0, **quiet), 0.0)
    assert slo_met(status) == ("Unknown", "NoSamples", "T0")
    _, status = _round(spec, status, _pods(1, 40.0, **quiet), 10.0)
    assert slo_met(status) == ("Unknown", "NoSamples", "T0")
    _, status = _round(spec, status, _pods(1, 50.0), 20.0)
    assert slo_met(status) == ("True", "WithinTarget", "T20")


SLOW_LINE = replace(LINE, ttft_hist=_hist(3.0, 60))  # p90 3 s: three times the target


def test_a_round_records_slo_replicas_one_history_and_events() -> None:
    history = [{"time": str(i), "kind": "Knobs"} for i in range(9)]
    status = {"desiredReplicas": 1, "tuning": {**PENDING_RAISE, "history": history}}
    plan = plan_round(_spec(), status, {"p": [SLOW_LINE]}, now=1000.0, num_ready=1)
    scaling = plan.decision.scaling
    assert scaling is not None and scaling.reason == "up-ttft-miss" and plan.decision.desired == 2
    patch = status_patch(_spec(), plan, ONE, status, observed_generation=1, now_text="T0")
    assert patch["desiredReplicas"] == 2 and patch["scaling"]["reason"] == "up-ttft-miss"
    assert patch["scaling"]["lastChange"]["from"] == 1 and patch["scaling"]["lastChange"]["to"] == 2
    assert patch["slo"]["ttftP90Seconds"] > 1.0 and patch["slo"]["attainment"] == 0.885
    slo_met = next(c for c in patch["conditions"] if c["type"] == "SLOMet")
    assert (slo_met["status"], slo_met["reason"]) == ("False", "TTFTAboveTarget")
    # One history for both, newest last, bounded: the tuner's change, then the scaler's.
    entries = patch["tuning"]["history"]
    assert len(entries) == 10 and [e["kind"] for e in entries[-2:]] == ["Knobs", "Replicas"]
    assert entries[0] == {"time": "1", "kind": "Knobs"}
    assert entries[-1]["from"] == {"replicas": 1} and entries[-1]["to"] == {"replicas": 2}
    events = [(e.type, e.reason) for e in round_events(plan, ONE)]
    assert events == [("Normal", "Tuned"), ("Normal", "ScaledUp"), ("Warning", "SLOMissed")]


def test_slo_missed_is_an_event_on_the_transition_only() -> None:
    spec = _spec(autoscaling={"enabled": False})
    lines = {"p": [SLOW_LINE]}
    plan, status = _round(spec, {}, lines, 0.0)
    assert plan.decision.scaling is None
    missed = [e for e in round_events(plan, ONE) if e.reason == "SLOMissed"]
    assert len(missed) == 1 and missed[0].message.startswith("TTFTAboveTarget: TTFT p90")
    assert plan.slo_met_before is None
    # Still missing a window later: SLOMet was False already, no second Event.
    again, _ = _round(spec, status, {"p": [SLOW_LINE, replace(SLOW_LINE, t=40.0)]}, 10.0)
    assert again.slo_met_before == "False" and again.decision.verdict is not None
    assert again.decision.verdict.is_met is False
    assert not [e for e in round_events(again, ONE) if e.reason == "SLOMissed"]
    recorded = {"conditions": [{"type": "SLOMet", "status": "True"}]}
    back, _ = _round(spec, recorded, lines, 0.0)
    assert [e.reason for e in round_events(back, ONE)] == ["SLOMissed"]


def test_advisory_knobs_are_recorded_not_pushed() -> None:
    spec = _spec(advisory=True)
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
    plan = plan_round(_spec(), {}, {}, now=0.0, num_ready=2)
    assert plan.decision.stats is None
    patch = status_patch(_spec(), plan, PushOutcome(0, 2), {}, observed_generation=1, now_text="T")
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
    spec = _spec()
    status: dict[str, Any] = {"desiredReplicas": 1, "tuning": {**PENDING_RAISE}}
    lines = {"a": [replace(LINE, **BURST)], "b": [_statline(30.0, **BURST)]}
    plan, status = _round(spec, status, lines, 1000.25)
    state = plan.decision.state
    # Every part of it carries something, so a lost part would show.
    assert state.knobs is not None and state.knobs != spec.start_knobs()
    assert state.tuner.cooldown_remaining > 0
    assert state.scaler.recommendations and state.scaler.loaded_at == 1000.25
    assert state.windows.last_t == {"a": 30.0, "b": 30.0} and state.windows.entered_at == 1000.25
    assert state.replicas == 1  # the single burst held
    assert controller_state(spec, status) == state
    # And once more after a round that moves the replicas.
    lines = {"a": [replace(LINE, t=40.0, **BURST)], "b": [_statline(40.0, **BURST)]}
    plan, status = _round(spec, status, lines, 1010.5)
    assert (
        plan.decision.state.replicas == 3 and len(plan.decision.state.scaler.recommendations) == 2
    )
    assert controller_state(spec, status) == plan.decision.state


def test_a_round_without_a_new_window_keeps_the_slo_verdict() -> None:
    """A wake-up round judges nothing: SLOMet, status.slo and the preemption stats stand,
    and the next window does not post SLOMissed again."""
    spec = _spec(autoscaling={"enabled": False})
    _, status = _round(spec, {}, {"p": [SLOW_LINE]}, 0.0)
    _, status = _round(spec, status, {"p": [SLOW_LINE]}, 5.0, is_deciding=False)  # wake-up
    assert status["slo"].get("ttftP90Seconds", 0.0) > 1.0
    slo_met = next(c for c in status["conditions"] if c["type"] == "SLOMet")
    assert slo_met["status"] == "False"
    later, _ = _round(spec, status, {"p": [SLOW_LINE, replace(SLOW_LINE, t=40.0)]}, 10.0)
    assert "SLOMissed" not in [e.reason for e in round_events(later, ONE)]
