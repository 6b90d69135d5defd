"""The pool controller (genpool_core.controller): one round's phases, and that it is the
only caller of the tuner and the scaler in the product and the simulator."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from genpool_core import ttft_histogram
from genpool_core.controller import (
    ControllerSettings,
    ControllerState,
    Observation,
    replicas_in_force,
    run_round,
)
from genpool_core.knobs import KnobBounds, Knobs
from genpool_core.scaler import ScalerSettings
from genpool_core.slo_check import SloTarget
from genpool_core.statline import StatLine
from genpool_core.tuner import TunerSettings, TunerState

ROOT = Path(__file__).resolve().parents[3]
INTERVAL = 30.0
SCALER = ScalerSettings(ttft_p90_s=1.0, min_replicas=1, max_replicas=8, max_batch=8,
                        attainment=0.8, is_pausing=True, interval_s=INTERVAL)  # fmt: skip
SETTINGS = ControllerSettings(
    interval_s=INTERVAL, start_replicas=2, bounds=KnobBounds(0, 8, 0, 8),
    start_knobs=Knobs(3, 3), is_pausing=True, tuner=TunerSettings(confirm_rounds=1),
    scaler=SCALER, slo=SloTarget(1.0, 0.8),
)  # fmt: skip


def hist(seconds: float, n: int) -> tuple[int, ...]:
    counts = [0] * ttft_histogram.NUM_BUCKETS
    counts[ttft_histogram.bucket_of(seconds)] = n
    return tuple(counts)


def line(t: float, **fields: object) -> StatLine:
    """A worker whose cap binds with waiters at risk and the budget unspent: raise."""
    base: dict[str, object] = {
        "t": t, "mode": "target_output_tps", "residents": 8, "active": 5, "paused": 3,
        "cap": 3, "headroom": 3, "waiters": 2, "at_risk": 1, "completed_window": 30,
        "below_target_window": 0.0, "victims": {"laxity": 5}, "pauses_window": 6,
        "arrivals_window": 30, "steps_window": 900, "batch_mean": 5.0,
        "ttft_hist": hist(0.3, 30),
    }  # fmt: skip
    return StatLine(**(base | fields))  # type: ignore[arg-type]


def observe(*times: float, deciding: bool = True) -> Observation:
    return Observation({"p-0": [line(t) for t in times]}, num_ready=2, is_deciding=deciding)


def test_a_round_tunes_scales_and_judges_on_the_new_window() -> None:
    decision = run_round(SETTINGS, ControllerState(), observe(30.0), now=31.0)
    assert decision.tuning is not None and decision.tuning.reason == "raise-cap-budget-unspent"
    assert decision.knobs == Knobs(4, 4) and decision.state.knobs == Knobs(4, 4)
    assert decision.scaling is not None and decision.state.replicas == decision.desired
    assert decision.verdict is not None and decision.verdict.is_met is True
    assert decision.state.windows.last_t == {"p-0": 30.0}


def test_a_wake_round_decides_nothing_and_leaves_the_window_for_the_next() -> None:
    woken = run_round(SETTINGS, ControllerState(), observe(30.0, deciding=False), now=31.0)
    assert woken.tuning is None and woken.scaling is None
    assert woken.state == ControllerState(knobs=Knobs(3, 3))  # the window is still to count
    due = run_round(SETTINGS, woken.state, observe(30.0), now=32.0)
    assert due.tuning is not None and due.tuning.changed


def test_no_new_window_no_turn_and_stale_stats_freeze_both() -> None:
    first = run_round(SETTINGS, ControllerState(), observe(30.0), now=31.0)
    again = run_round(SETTINGS, first.state, observe(30.0), now=45.0)
    assert again.tuning is None and again.scaling is None and not again.is_stale
    stale = run_round(SETTINGS, first.state, observe(30.0), now=31.0 + 2 * INTERVAL + 1)
    assert stale.is_stale and stale.fresh_stats is None
    assert stale.tuning is not None and stale.tuning.reason == "stats-stale"
    assert stale.scaling is not None and stale.scaling.reason == "stats-missing"
    assert stale.verdict is not None and stale.verdict.is_met is None


def test_advisory_decides_and_records_but_applies_nothing() -> None:
    advisory = replace(SETTINGS, is_advisory=True)
    state = ControllerState(replicas=5)
    decision = run_round(advisory, state, observe(30.0), now=31.0)
    assert decision.tuning is not None and decision.tuning.changed
    assert decision.knobs == Knobs(3, 3) and decision.state.knobs == Knobs(3, 3)
    assert decision.state.tuner != TunerState()  # the tuner's own counters advance
    assert decision.replicas_before == 2 == replicas_in_force(advisory, state)  # what runs
    assert decision.knob_change_text().startswith("advisory, not applied:")


def test_without_pausing_or_tuner_or_scaler_their_turns_are_skipped() -> None:
    off = ControllerSettings(interval_s=INTERVAL, start_replicas=3)
    decision = run_round(off, ControllerState(), observe(30.0), now=31.0)
    assert decision.tuning is None and decision.scaling is None and decision.verdict is None
    assert decision.knobs == Knobs(0, 0) and decision.desired == 3
    assert decision.stats is not None and decision.stats.completed_window == 30


def test_knobs_in_force_are_clamped_into_new_bounds() -> None:
    narrow = replace(SETTINGS, bounds=KnobBounds(0, 2, 0, 2), tuner=None)
    decision = run_round(narrow, ControllerState(knobs=Knobs(6, 6)), observe(30.0), now=31.0)
    assert decision.knobs_before == Knobs(2, 2) == decision.knobs


def test_replica_news_is_a_change_or_new_advice() -> None:
    # 10 req/s of 8 position-seconds each: 80 positions, about 13 replicas of 8 at 0.8
    busy = line(30.0, arrivals_window=300, completed_window=300, batch_seconds=2400.0)
    missed = Observation({"p-0": [busy]}, num_ready=2)
    up = run_round(SETTINGS, ControllerState(), missed, now=31.0)
    assert up.desired == 8 and up.is_replica_news  # at max replicas
    assert up.replica_change_text().startswith(
        "up-forecast: replicas 2 -> 8 (forecast 10.00 req/s, capacity 0.80 req/s per replica"
    )
    advisory = replace(SETTINGS, is_advisory=True)
    advice = run_round(advisory, ControllerState(replicas=up.desired), missed, now=31.0)
    assert not advice.is_replica_news  # the same advice as recorded


def test_the_controller_is_the_only_caller_of_the_tuner_and_the_scaler() -> None:
    """No product, simulator or bench module calls tune() or scale() but the controller."""
    call = re.compile(r"(?<!def )(?<![\w.])(tune|scale|tuner\.tune|scaler\.scale)\(")
    imports = re.compile(r"from genpool_core(\.| import )(tuner|scaler)\b")
    callers = []
    for package in ("core", "operator", "sim", "worker", "devcluster", "bench", "cli"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            if call.search(text) and imports.search(text):
                callers.append(path.relative_to(ROOT).as_posix())
    assert callers == ["core/genpool_core/controller.py"]
