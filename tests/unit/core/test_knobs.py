"""The knobs' start: the SLO mode opens the pause budget at A, the others at 0.375 A."""

from __future__ import annotations

import pytest

from genpool_core.knobs import (
    DEFAULT_PAUSED_CAP_FRACTION,
    KnobBounds,
    Knobs,
    start_paused_cap_fraction,
)
from genpool_core.names import PreemptionMode


@pytest.mark.parametrize(
    ("mode", "knobs"),
    [
        (PreemptionMode.TARGET_OUTPUT_TPS, Knobs(16, 16)),
        (PreemptionMode.TPOT_BUDGET, Knobs(6, 6)),
        (PreemptionMode.OFF, Knobs(6, 6)),
    ],
)
def test_each_mode_starts_its_knobs_at_its_fraction_of_a(
    mode: PreemptionMode, knobs: Knobs
) -> None:
    bounds = KnobBounds(0, 16, 0, 16)
    assert bounds.start(16, start_paused_cap_fraction(mode)) == knobs


def test_the_start_stays_within_the_bounds() -> None:
    fraction = start_paused_cap_fraction(PreemptionMode.TARGET_OUTPUT_TPS)
    assert KnobBounds(0, 10, 0, 4).start(16, fraction) == Knobs(4, 4)
    assert KnobBounds(12, 16, 0, 16).start(16) == Knobs(12, 6)
    assert KnobBounds(0, 16, 0, 16).start(16) == KnobBounds(0, 16, 0, 16).start(
        16, DEFAULT_PAUSED_CAP_FRACTION
    )
