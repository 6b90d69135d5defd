"""The live config carries its generation: both apply together, and never go back."""

from __future__ import annotations

import pytest

from genpool_core.knobs import Knobs
from genpool_core.live import LiveConfig, StaleGenerationError
from tests.unit.support import make_scheduler


def test_the_generation_is_applied_with_the_knobs_and_never_goes_back() -> None:
    scheduler = make_scheduler(8, {"target_output_tps": 10.0}, max_num_active_requests=8)
    live = scheduler.live_config()
    assert live.generation == 0
    scheduler.reconfigure(live.updated({"generation": 3, "paused_cap": 1}))
    now = scheduler.live_config()
    assert (now.generation, now.knobs.paused_cap) == (3, 1)
    with pytest.raises(StaleGenerationError, match="stale generation 2 < 3"):
        now.updated({"generation": 2, "paused_cap": 0})
    same = now.updated({"generation": 3, "paused_cap": 0})  # a retry of the same generation
    assert same.generation == 3 and same.knobs.paused_cap == 0
    # a refused update changes nothing: neither the knobs nor the generation
    with pytest.raises(ValueError, match="resident_headroom"):
        scheduler.reconfigure(now.updated({"generation": 9, "resident_headroom": 10_000}))
    assert scheduler.live_config() == now
    # the simulator's set_knobs keeps the generation
    scheduler.set_knobs(Knobs(now.knobs.resident_headroom, 0))
    assert scheduler.live_config().generation == 3


def test_a_bad_generation_is_refused_by_type() -> None:
    live = LiveConfig(Knobs(2, 1), 0.5, 0.25, 30.0)
    with pytest.raises(TypeError, match="generation"):
        live.updated({"generation": "4"})
    with pytest.raises(ValueError, match="not live fields: color"):
        live.updated({"color": 1})
