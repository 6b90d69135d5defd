"""The tuner (docs/design.md#tuner) on stat-line sequences recorded from the simulator
(tests/unit/core/data, `python -m bench.record_statlines`), plus properties."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_core.aggregate import PoolStats, aggregate
from genpool_core.knobs import KnobBounds as Bounds
from genpool_core.knobs import Knobs
from genpool_core.statline import StatLine, parse_statline
from genpool_core.tuner import Decision, TunerSettings, TunerState, tune

DATA = Path(__file__).parent / "data"
WIDE = Bounds(0, 16, 0, 16)
GUARDED = TunerSettings()
LITERAL = TunerSettings(guarded=False)


@cache
def rounds(name: str) -> tuple[PoolStats, ...]:
    """The recorded pool, one aggregate per 30 s round."""
    by_round: dict[int, list[StatLine | None]] = {}
    for text in (DATA / f"{name}.txt").read_text().splitlines():
        line = parse_statline(text)
        if line is not None:
            by_round.setdefault(int(line.t // 30), []).append(line)
    pools = [aggregate(lines) for _, lines in sorted(by_round.items())]
    return tuple(pool for pool in pools if pool is not None)


def replay(
    name: str, knobs: Knobs, tuner: TunerSettings = GUARDED, bounds: Bounds = WIDE
) -> list[Decision]:
    state, decisions = TunerState(), []
    for stats in rounds(name):
        decision = tune(knobs, bounds, stats, state, tuner, stale=False)
        knobs, state = decision.knobs, decision.state
        decisions.append(decision)
    return decisions


def changes(decisions: list[Decision]) -> list[Decision]:
    return [d for d in decisions if d.changed]


def test_recordings_cover_their_scenarios() -> None:
    assert all(len(rounds(n)) >= 6 for n in ("unspent", "overload_laxity", "light"))
    assert all(r.below_target_window is not None for r in rounds("unspent"))
    assert max(r.below_target_window or 0 for r in rounds("unspent")) < 0.2
    assert min(r.below_target_window or 1 for r in rounds("overload_laxity")) > 0.2


def test_raises_the_cap_when_the_budget_is_unspent_and_waiters_are_at_risk() -> None:
    made = changes(replay("unspent", Knobs(6, 6)))
    assert made, "the cap binds with below-T under eps: the tuner must raise it"
    assert made[0].reason == "raise-cap-budget-unspent"
    assert made[0].knobs.paused_cap > 6
    assert made[0].knobs.resident_headroom >= made[0].knobs.paused_cap
    caps = [d.knobs.paused_cap for d in made]
    assert caps == sorted(caps), "only raises on this recording"


def test_raise_stops_at_the_bounds() -> None:
    bounds = Bounds(0, 7, 0, 7)
    decisions = replay("unspent", Knobs(6, 6), bounds=bounds)
    assert max(d.knobs.paused_cap for d in decisions) == 7
    assert decisions[-1].reason == "hold"


def test_literal_rule_lowers_the_cap_when_below_target_exceeds_eps() -> None:
    made = changes(replay("overload_laxity", Knobs(6, 6), LITERAL))
    assert made and made[0].reason == "lower-cap-below-target"
    assert made[0].knobs == Knobs(6, 4)  # headroom stays: given back only later


def test_guarded_rule_raises_on_misses_from_queueing() -> None:
    """All victims are laxity victims: the misses are queueing, a lower cap adds to them."""
    made = changes(replay("overload_laxity", Knobs(6, 6)))
    assert made and {d.reason for d in made} == {"raise-cap-queueing-misses"}


def test_guarded_rule_lowers_when_the_pauses_are_implicated() -> None:
    decisions = replay("overload_implicated", Knobs(16, 16))
    made = changes(decisions)
    assert made and made[0].reason == "lower-cap-below-target"
    assert made[0].knobs.paused_cap < 16


def test_negative_credit_lowers_the_cap() -> None:
    overload = rounds("overload_implicated")[3]
    assert overload.credit_sum is not None and overload.credit_sum < 0
    in_dead_band = replace(overload, below_target_window=0.17)  # neither unspent nor above eps
    pending = TunerState(0, "lower-cap-negative-credit", 1)
    decision = tune(Knobs(16, 16), WIDE, in_dead_band, pending, GUARDED, stale=False)
    assert decision.reason == "lower-cap-negative-credit" and decision.changed
    laxity_only = replace(rounds("overload_laxity")[3], below_target_window=0.17)
    state = TunerState(0, "lower-cap-negative-credit", 1)
    literal = tune(Knobs(6, 6), WIDE, laxity_only, state, LITERAL, stale=False)
    assert literal.reason == "lower-cap-negative-credit"
    assert tune(Knobs(6, 6), WIDE, laxity_only, state, GUARDED, stale=False).reason == "hold"


def test_mostly_sacrificed_victims_lower_the_cap() -> None:
    stats = replace(rounds("unspent")[4], victims={"laxity": 3, "sacrificed": 9})
    state = TunerState(0, "lower-cap-sacrificed", 1)
    decision = tune(Knobs(8, 8), WIDE, stats, state, GUARDED, stale=False)
    assert decision.reason == "lower-cap-sacrificed" and decision.knobs.paused_cap == 6


def test_light_load_holds() -> None:
    assert {d.reason for d in replay("light", Knobs(6, 6))} == {"hold"}


def test_unused_headroom_is_given_back_after_a_sustained_period() -> None:
    decisions = replay("light", Knobs(12, 6))
    reasons = [d.reason for d in decisions]
    first = reasons.index("shrink-headroom-unused")
    assert first == GUARDED.shrink_rounds - 1
    assert all(r == "hold-hysteresis" for r in reasons[:first])
    assert decisions[first].knobs == Knobs(9, 6)
    assert min(d.knobs.resident_headroom for d in decisions) >= 6


def test_stale_or_missing_stats_change_nothing() -> None:
    stats = rounds("unspent")[5]
    pending = TunerState(0, "raise-cap-budget-unspent", 1)
    for decision in (
        tune(Knobs(6, 6), WIDE, stats, pending, GUARDED, stale=True),
        tune(Knobs(6, 6), WIDE, None, pending, GUARDED, stale=False),
    ):
        assert decision == Decision(Knobs(6, 6), "stats-stale", False, replace(pending,
                                    pending_rounds=0))  # fmt: skip


def test_hysteresis_needs_consecutive_rounds() -> None:
    unspent, light = rounds("unspent")[5], rounds("light")[5]
    first = tune(Knobs(6, 6), WIDE, unspent, TunerState(), GUARDED, stale=False)
    assert (first.reason, first.changed) == ("hold-hysteresis", False)
    broken = tune(Knobs(6, 6), WIDE, light, first.state, GUARDED, stale=False)
    assert broken.reason == "hold" and broken.state == TunerState()
    again = tune(Knobs(6, 6), WIDE, unspent, broken.state, GUARDED, stale=False)
    assert again.reason == "hold-hysteresis"
    done = tune(Knobs(6, 6), WIDE, unspent, again.state, GUARDED, stale=False)
    assert done.changed and done.knobs == Knobs(8, 8)


def test_cooldown_freezes_the_knobs_after_a_change() -> None:
    decisions = replay("unspent", Knobs(6, 6), TunerSettings(cooldown_intervals=3))
    index = next(i for i, d in enumerate(decisions) if d.changed)
    following = [d.reason for d in decisions[index + 1 : index + 4]]
    assert following == ["hold-cooldown"] * 3
    assert not any(d.changed for d in decisions[index + 1 : index + 4])


def test_out_of_bounds_knobs_are_clamped_at_once() -> None:
    state = TunerState(cooldown_remaining=2)
    decision = tune(Knobs(14, 12), Bounds(0, 8, 0, 8), None, state, GUARDED, stale=True)
    assert decision.knobs == Knobs(8, 8)
    assert (decision.reason, decision.changed) == ("clamp-to-bounds", True)


def test_other_modes_hold() -> None:
    stats = replace(rounds("unspent")[5], mode="tpot_budget")
    state = TunerState(0, "raise-cap-budget-unspent", 1)
    assert tune(Knobs(6, 6), WIDE, stats, state, GUARDED, stale=False).reason == "hold-not-slo-mode"


def test_clamp_keeps_p_at_most_h() -> None:
    assert Bounds(0, 10, 0, 10).clamp(Knobs(2, 5)) == Knobs(5, 5)
    assert Bounds(1, 6, 2, 4).clamp(Knobs(20, 20)) == Knobs(6, 4)
    assert Bounds(3, 6, 2, 4).clamp(Knobs(0, 0)) == Knobs(3, 2)


@pytest.mark.parametrize("args", [(-1, 4, 0, 4), (5, 4, 0, 4), (0, 4, 3, 2), (0, 4, 0, 5)])
def test_bad_bounds_are_refused(args: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError):
        Bounds(*args)


@pytest.mark.parametrize(
    "kwargs", [{"eps": 0.0}, {"dead_band": 0.3}, {"min_step": 0}, {"confirm_rounds": 0}]
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TunerSettings(**kwargs)  # type: ignore[arg-type]


def test_state_survives_a_restart_through_the_status() -> None:
    state = TunerState(2, "raise-cap-budget-unspent", 1)
    assert TunerState.from_status(state.to_status()) == state
    assert TunerState.from_status(None) == TunerState()
    garbage = {"cooldownRemaining": "x", "pendingReason": 3, "pendingRounds": float("nan")}
    assert TunerState.from_status(garbage) == TunerState()
    assert TunerState.from_status({"cooldownRemaining": -4}).cooldown_remaining == 0


# -- properties -----------------------------------------------------------------------


@st.composite
def bounds_strategy(draw: st.DrawFn) -> Bounds:
    h_max = draw(st.integers(0, 64))
    h_min = draw(st.integers(0, h_max))
    c_max = draw(st.integers(0, h_max))
    return Bounds(h_min, h_max, draw(st.integers(0, c_max)), c_max)


optional_ratio = st.none() | st.floats(0, 1)
pool_stats = st.builds(
    PoolStats,
    workers_reporting=st.integers(1, 8),
    mode=st.sampled_from(["target_output_tps", "tpot_budget", "mixed"]),
    paused=st.integers(0, 200),
    paused_cap=st.integers(0, 200), resident_headroom=st.integers(0, 200),
    waiters=st.integers(0, 500),
    at_risk=st.integers(0, 50), completed_window=st.integers(0, 500),
    pauses_window=st.integers(0, 500), laxity_resumes=st.integers(0, 100),
    victims=st.dictionaries(st.sampled_from(["laxity", "below_target", "sacrificed"]),
                            st.integers(0, 100)),
    below_target_window=optional_ratio, below_target_total=optional_ratio,
    credit_sum=st.none() | st.floats(-5000, 5000),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    bounds=bounds_strategy(),
    start=st.tuples(st.integers(0, 80), st.integers(0, 80)),
    sequence=st.lists(st.tuples(st.none() | pool_stats, st.booleans()), max_size=25),
    guarded=st.booleans(),
    cooldown=st.integers(0, 3),
)
def test_never_leaves_the_bounds_and_never_p_above_h(
    bounds: Bounds,
    start: tuple[int, int],
    sequence: list[tuple[PoolStats | None, bool]],
    guarded: bool,
    cooldown: int,
) -> None:
    tuner = TunerSettings(guarded=guarded, cooldown_intervals=cooldown)
    knobs, state = Knobs(*start), TunerState()
    for index, (stats, stale) in enumerate(sequence):
        decision = tune(knobs, bounds, stats, state, tuner, stale=stale)
        new = decision.knobs
        assert bounds.min_paused_cap <= new.paused_cap <= bounds.max_paused_cap
        assert bounds.min_resident_headroom <= new.resident_headroom <= bounds.max_resident_headroom
        assert new.paused_cap <= new.resident_headroom
        assert decision.changed == (new != knobs)
        if (stale or stats is None) and index > 0:  # after the first round knobs are clamped
            assert not decision.changed
        knobs, state = new, decision.state


@pytest.mark.parametrize("kv", [{"kv_used": 0.97}, {"kv_used": 0.6, "kv_paused": 0.55}])
def test_a_raise_is_held_while_kv_memory_binds(kv: dict[str, float]) -> None:
    """A pause frees no KV block: with the cache full, or paused requests already holding
    half of it, more paused slots would admit no one (docs/design.md#kv-blocks)."""
    raising = next(s for s in rounds("unspent") if _proposes_raise(s))
    pending = TunerState(0, "raise-cap-budget-unspent", 1)
    held = tune(Knobs(6, 6), WIDE, replace(raising, **kv), pending, GUARDED, stale=False)
    assert (held.knobs, held.reason, held.changed) == (Knobs(6, 6), "hold-kv-bound", False)
    roomy = replace(raising, kv_used=0.5, kv_paused=0.2)
    assert tune(Knobs(6, 6), WIDE, roomy, pending, GUARDED, stale=False).changed


def _proposes_raise(stats: PoolStats) -> bool:
    pending = TunerState(0, "raise-cap-budget-unspent", 1)
    return tune(Knobs(6, 6), WIDE, stats, pending, GUARDED, stale=False).changed
