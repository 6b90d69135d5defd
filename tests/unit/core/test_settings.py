import math

import pytest

from genpool_core.preemption import (
    GenCapacity,
    GenPreemptionConfigError,
    PreemptionMode,
    TpotBudgetPolicy,
    create_gen_preemption,
)


@pytest.mark.parametrize(
    ("settings", "capacity", "message"),
    [
        ({"tpot_budget": 0.1, "target_output_tps": 10.0}, GenCapacity(8), "not both"),
        ({"target_output_tps": 0.0}, GenCapacity(8), "target_output_tps must be a positive"),
        ({"target_output_tps": -3.0}, GenCapacity(8), "target_output_tps must be a positive"),
        ({"target_output_tps": math.nan}, GenCapacity(8), "target_output_tps must be a positive"),
        ({"tpot_budget": -0.1}, GenCapacity(8), "tpot_budget must be positive"),
        ({"tpot_budget": 0.1}, GenCapacity(8, pipeline_parallel_size=2), "pipeline_parallel"),
        ({"tpot_budget": 0.1, "paused_cap": 5, "resident_headroom": 4}, GenCapacity(8), "exceeds"),
        (
            {"tpot_budget": 0.1, "paused_cap": 5, "resident_headroom": 2},
            GenCapacity(8),
            "paused_cap=5",
        ),
        (
            {"tpot_budget": 0.1, "resident_headroom": 6, "max_resident_headroom": 4},
            GenCapacity(8),
            "max_resident_headroom",
        ),
        ({"tpot_budget": 0.1, "bogus_knob": 1}, GenCapacity(8), "bogus_knob"),
        ({"slack_s": -1.0}, GenCapacity(8), "slack_s"),
        ({"slack_s": "soon"}, GenCapacity(8), "slack_s"),
        ({"admission_target_min_s": 5.0, "admission_target_max_s": 1.0}, GenCapacity(8), "exceeds"),
        ({}, GenCapacity(0), "max_batch_size"),
        ({"target_output_tps": 5.0}, GenCapacity(8, max_num_active_requests=0), "active"),
    ],
)
def test_setup_check_rejects_with_a_clear_message(
    settings: dict[str, object], capacity: GenCapacity, message: str
) -> None:
    with pytest.raises(GenPreemptionConfigError, match=message):
        create_gen_preemption(settings, capacity)


def test_pipeline_parallel_is_fine_with_preemption_off() -> None:
    policy = create_gen_preemption({}, GenCapacity(8, pipeline_parallel_size=4))
    assert policy.mode is PreemptionMode.OFF
    assert policy.enabled_line() == "gen_preemption disabled"
    assert policy.capacity.resident_headroom == 0 and policy.capacity.paused_cap == 0


def test_defaults_follow_the_capacity_model() -> None:
    policy = create_gen_preemption({"tpot_budget": 0.1}, GenCapacity(16, 32))
    assert isinstance(policy, TpotBudgetPolicy)
    assert policy.capacity.paused_cap == 12  # floor(0.375 * A), A = 32
    assert policy.capacity.resident_headroom == 12
    assert policy.capacity.max_resident_headroom == 12
    line = policy.enabled_line()
    assert "mode=tpot_budget" in line and "tpot_budget=0.1" in line
    assert "max_pauses_per_request=2" in line and "initial_window_s=0.25" in line
