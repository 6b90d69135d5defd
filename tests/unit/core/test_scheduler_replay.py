"""Every scheduling pass decides what the recorded reference decided.

The reference was recorded from the scheduler before the policy refactor
and the incremental victim search; see ``scheduler_replay.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.unit import scheduler_replay

REFERENCE = json.loads(scheduler_replay.REFERENCE.read_text())


def _check(name: str, got: dict[str, object]) -> None:
    want = REFERENCE[name]
    samples = got["samples"]
    assert isinstance(samples, dict)
    first_bad = next((n for n, digest in want["samples"].items() if samples.get(n) != digest), None)
    assert first_bad is None, f"{name}: pass {first_bad} decided differently"
    assert got == want


@pytest.mark.parametrize("mode", scheduler_replay.MODES)
def test_simulated_pool_passes_match_the_reference(mode: str) -> None:
    _check(mode, scheduler_replay.replay(mode))


@pytest.mark.parametrize("shape", scheduler_replay.SATURATED, ids=lambda s: s.name)
@pytest.mark.parametrize("mode", list(scheduler_replay.SATURATED_SETTINGS))
def test_saturated_passes_match_the_reference(shape: scheduler_replay.Saturated, mode: str) -> None:
    _check(f"{shape.name}_{mode}", scheduler_replay.replay_saturated(shape, mode))


def test_the_reference_exercises_pausing_and_live_knobs() -> None:
    for name, run in REFERENCE.items():
        assert run["passes"] > 2000, name
        if "tpot_budget" in name or "target_output_tps" in name:
            assert run["paused"] > 50 and run["resumed"] > 50 and run["knob_changes"] > 2, name
