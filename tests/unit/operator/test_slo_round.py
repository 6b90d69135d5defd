"""The SLO in a round: the measure and the verdict, SLOMet and its transition time, the
SLOMissed Event on a transition only, and a round with no new window judging nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genpool_core.slo_check import NO_MEASURE, SloTarget, measure_slo, slo_verdict
from genpool_operator.round_plan import (
    controller_settings,
    plan_round,
    round_events,
    status_patch,
)
from genpool_operator.spec import GenPoolSpec
from tests.unit.operator.rounds import (
    LINE,
    ONE,
    PENDING_RAISE,
    auto_spec,
    hist,
    pods,
    run_round,
)  # fmt: skip


def test_slo_verdict_names_what_misses() -> None:
    assert controller_settings(GenPoolSpec.from_body({})).slo is None
    target = controller_settings(auto_spec()).slo
    assert target == SloTarget(1.0, 0.8)
    off = controller_settings(auto_spec(preemption={"mode": "Off"})).slo
    assert off == SloTarget(1.0, None)  # no T, TTFT alone is judged

    def judge(target: SloTarget | None, **line: Any) -> Any:
        assert target is not None
        plan = plan_round(auto_spec(), {}, pods(1, 30.0, **line), now=0.0, num_ready=1)
        return slo_verdict(target, plan.decision.slo)

    met = judge(target)
    assert met.is_met and met.reason == "WithinTarget"
    slow = judge(target, ttft_hist=hist(3.0, 50))
    assert slow.is_met is False and slow.reason == "TTFTAboveTarget"
    lost = judge(target, below_target_window=0.5)
    assert lost.reason == "AttainmentBelowTarget"
    assert "attainment 0.500 (target 0.8)" in lost.message
    assert judge(off, below_target_window=0.5).is_met  # attainment is not judged without T
    unknown = slo_verdict(target, measure_slo(None))
    assert unknown.is_met is None and unknown.reason == "NoSamples"
    assert measure_slo(None) == NO_MEASURE


def test_unknown_slo_keeps_its_transition_time() -> None:
    spec = auto_spec(autoscaling={"enabled": False})

    def slo_met(status: Mapping[str, Any]) -> tuple[str, str, str]:
        found = next(c for c in status["conditions"] if c["type"] == "SLOMet")
        return found["status"], found["reason"], found["lastTransitionTime"]

    quiet = {"ttft_hist": (), "completed_window": 0}  # no first token in the window
    _, status = run_round(spec, {}, pods(1, 30.0, **quiet), 0.0)
    assert slo_met(status) == ("Unknown", "NoSamples", "T0")
    _, status = run_round(spec, status, pods(1, 40.0, **quiet), 10.0)
    assert slo_met(status) == ("Unknown", "NoSamples", "T0")
    _, status = run_round(spec, status, pods(1, 50.0), 20.0)
    assert slo_met(status) == ("True", "WithinTarget", "T20")


SLOW_LINE = replace(LINE, ttft_hist=hist(3.0, 60))  # p90 3 s: three times the target
# a pool the scaler has watched settle: its tail a round ago as high as now
SETTLED = {"state": {"estimates": {"level": 1.0, "ready": 1, "calmRounds": 3, "tail": 2.0}}}


def test_a_round_records_slo_replicas_one_history_and_events() -> None:
    history = [{"time": str(i), "kind": "Knobs"} for i in range(9)]
    status = {"desiredReplicas": 1, "tuning": {**PENDING_RAISE, "history": history},
              "scaling": SETTLED}  # fmt: skip
    slow = {"p": [replace(SLOW_LINE, waiters=0)]}
    plan = plan_round(auto_spec(), status, slow, now=1000.0, num_ready=1)
    scaling = plan.decision.scaling
    assert scaling is not None and scaling.reason == "up-tail" and plan.decision.desired == 2
    patch = status_patch(auto_spec(), plan, ONE, status, observed_generation=1, now_text="T0")
    assert patch["desiredReplicas"] == 2 and patch["scaling"]["reason"] == "up-tail"
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
    spec = auto_spec(autoscaling={"enabled": False})
    lines = {"p": [SLOW_LINE]}
    plan, status = run_round(spec, {}, lines, 0.0)
    assert plan.decision.scaling is None
    missed = [e for e in round_events(plan, ONE) if e.reason == "SLOMissed"]
    assert len(missed) == 1 and missed[0].message.startswith("TTFTAboveTarget: TTFT p90")
    assert plan.slo_met_before is None
    # Still missing a window later: SLOMet was False already, no second Event.
    again, _ = run_round(spec, status, {"p": [SLOW_LINE, replace(SLOW_LINE, t=40.0)]}, 10.0)
    assert again.slo_met_before == "False" and again.decision.verdict is not None
    assert again.decision.verdict.is_met is False
    assert not [e for e in round_events(again, ONE) if e.reason == "SLOMissed"]
    recorded = {"conditions": [{"type": "SLOMet", "status": "True"}]}
    back, _ = run_round(spec, recorded, lines, 0.0)
    assert [e.reason for e in round_events(back, ONE)] == ["SLOMissed"]


def test_a_round_without_a_new_window_keeps_the_slo_verdict() -> None:
    """A wake-up round judges nothing: SLOMet, status.slo and the preemption stats stand,
    and the next window does not post SLOMissed again."""
    spec = auto_spec(autoscaling={"enabled": False})
    _, status = run_round(spec, {}, {"p": [SLOW_LINE]}, 0.0)
    _, status = run_round(spec, status, {"p": [SLOW_LINE]}, 5.0, is_deciding=False)  # wake-up
    assert status["slo"].get("ttftP90Seconds", 0.0) > 1.0
    slo_met = next(c for c in status["conditions"] if c["type"] == "SLOMet")
    assert slo_met["status"] == "False"
    later, _ = run_round(spec, status, {"p": [SLOW_LINE, replace(SLOW_LINE, t=40.0)]}, 10.0)
    assert "SLOMissed" not in [e.reason for e in round_events(later, ONE)]
