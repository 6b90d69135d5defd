"""Preemption policies: ``off``, ``tpot_budget`` and ``target_output_tps``."""

from __future__ import annotations

from genpool_core.names import PreemptionMode
from genpool_core.preemption.base import OffPolicy, PolicyBase, PreemptionPolicy
from genpool_core.preemption.pausing import (
    PauseLane,
    PreemptionCounters,
    Victim,
    is_in_hysteresis,
)
from genpool_core.preemption.settings import (
    GenCapacity,
    GenPreemptionConfigError,
    GenPreemptionSettings,
    ResolvedCapacity,
    parse_settings,
    resolve_capacity,
)
from genpool_core.preemption.slo import TargetOutputTpsPolicy
from genpool_core.preemption.tpot import TpotBudgetPolicy

_POLICIES: dict[PreemptionMode, type[PolicyBase]] = {
    PreemptionMode.OFF: OffPolicy,
    PreemptionMode.TPOT_BUDGET: TpotBudgetPolicy,
    PreemptionMode.TARGET_OUTPUT_TPS: TargetOutputTpsPolicy,
}


def create_gen_preemption(
    settings: GenPreemptionSettings | dict[str, object], capacity: GenCapacity
) -> PreemptionPolicy:
    """The one setup check: validate, apply defaults, build the policy.

    Raises :class:`GenPreemptionConfigError` with a message naming the bad setting.
    """
    parsed = parse_settings(settings)
    resolved = resolve_capacity(parsed, capacity)
    return _POLICIES[parsed.mode](parsed, resolved)


__all__ = [
    "GenCapacity",
    "GenPreemptionConfigError",
    "GenPreemptionSettings",
    "OffPolicy",
    "PauseLane",
    "PolicyBase",
    "PreemptionCounters",
    "PreemptionMode",
    "PreemptionPolicy",
    "ResolvedCapacity",
    "TargetOutputTpsPolicy",
    "TpotBudgetPolicy",
    "Victim",
    "create_gen_preemption",
    "is_in_hysteresis",
]
