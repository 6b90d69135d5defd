"""The live config carries its generation: both apply together, and never go back; one
type (``LiveUpdate``) is the wire format, the engine's inbox item and the push."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from genpool_core.knobs import Knobs
from genpool_core.live import LIVE_FIELDS, LiveConfig, LiveUpdate, StaleGenerationError
from tests.unit.support import make_scheduler


def test_the_generation_is_applied_with_the_knobs_and_never_goes_back() -> None:
    scheduler = make_scheduler(8, {"target_output_tps": 10.0}, max_num_active_requests=8)
    live = scheduler.live_config()
    assert live.generation == 0
    scheduler.reconfigure(live.updated(LiveUpdate(generation=3, paused_cap=1)))
    now = scheduler.live_config()
    assert (now.generation, now.knobs.paused_cap) == (3, 1)
    with pytest.raises(StaleGenerationError, match="stale generation 2 < 3"):
        now.updated(LiveUpdate(generation=2, paused_cap=0))
    same = now.updated(LiveUpdate(generation=3, paused_cap=0))  # a retried push
    assert same.generation == 3 and same.knobs.paused_cap == 0
    # a refused update changes nothing: neither the knobs nor the generation
    with pytest.raises(ValueError, match="resident_headroom"):
        scheduler.reconfigure(now.updated(LiveUpdate(generation=9, resident_headroom=10_000)))
    assert scheduler.live_config() == now
    # the simulator's set_knobs keeps the generation
    scheduler.set_knobs(Knobs(now.knobs.resident_headroom, 0))
    assert scheduler.live_config().generation == 3


def test_the_update_is_checked_whole_at_the_edge() -> None:
    for body, field in [
        ({"generation": "4"}, "generation"),
        ({"generation": -1}, "generation"),
        ({"generation": 1, "color": 1}, "color"),
        ({"generation": 1, "paused_cap": True}, "paused_cap"),
        ({"generation": 1, "slack_s": -0.5}, "slack_s"),
        ({"paused_cap": 1}, "generation"),
    ]:
        with pytest.raises(ValidationError, match=field):
            LiveUpdate.model_validate(body)
    update = LiveUpdate.model_validate({"generation": 2, "slack_s": 1, "paused_cap": 3})
    assert update.to_json() == {"generation": 2, "paused_cap": 3, "slack_s": 1.0}
    assert update.values() == {"paused_cap": 3, "slack_s": 1.0}
    assert LIVE_FIELDS == (
        "resident_headroom", "paused_cap", "slack_s", "admission_target_min_s",
        "admission_target_max_s",
    )  # fmt: skip
    live = LiveConfig(Knobs(2, 1), 0.5, 0.25, 30.0)
    assert live.updated(LiveUpdate(generation=0)) == live
