"""The simulator's modes: the worker's three preemption modes and the recompute baseline."""

from __future__ import annotations

import enum

from genpool_core.names import OFF_MODE, SLO_MODE, TPOT_MODE

RECOMPUTE_MODE = "recompute"  # the simulator's baseline: evict and recompute, never pause
MODES = (OFF_MODE, RECOMPUTE_MODE, TPOT_MODE, SLO_MODE)


class SimMode(enum.Enum):
    """The simulator's modes: the worker's three and the recompute baseline, parsed once."""

    OFF = OFF_MODE
    RECOMPUTE = RECOMPUTE_MODE
    TPOT_BUDGET = TPOT_MODE
    TARGET_OUTPUT_TPS = SLO_MODE

    @property
    def is_pausing(self) -> bool:
        return self in (SimMode.TPOT_BUDGET, SimMode.TARGET_OUTPUT_TPS)
