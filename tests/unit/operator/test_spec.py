"""The GenPool spec model: defaults, start knobs, worker.json and rejected specs."""

from __future__ import annotations

from typing import Any

import pytest

from genpool_core.knobs import KnobBounds, Knobs
from genpool_operator.spec import GenPoolSpec, GenPoolSpecError
from tests.invalid_genpools import INVALID_GENPOOLS, InvalidGenPool

TPS = {"mode": "TargetOutputTps", "targetOutputTps": 8}
TPOT = {"mode": "TpotBudget", "tpotBudget": 0.1}


def spec_of(**fields: Any) -> GenPoolSpec:
    return GenPoolSpec.from_body(fields)


def test_an_empty_spec_takes_the_contract_defaults() -> None:
    spec = GenPoolSpec.from_body(None)
    assert spec.replicas == 1 and spec.model == "smollm2-135m" and spec.image == ""
    assert spec.accelerator == "nvidia" and spec.tensor_parallel_size == 1
    assert spec.engine.max_batch_size == 16 and spec.engine.max_num_active_requests is None
    assert spec.preemption.mode == "Off" and spec.preemption.slack_seconds == 0.5
    assert spec.preemption.admission_target_seconds.max == 30.0
    assert spec.tuning.interval_seconds == 30 and spec.tuning.stats_source == "Http"
    assert spec.drain.timeout_seconds == 120
    assert spec.capacity_a() == 16
    assert spec.bounds() == KnobBounds(0, 16, 0, 16)


def test_camel_and_snake_case_both_accepted() -> None:
    camel = spec_of(engine={"maxBatchSize": 8})
    snake = spec_of(engine={"max_batch_size": 8})
    assert camel == snake


@pytest.mark.parametrize(
    ("fields", "knobs"),
    [
        ({}, (0, 0)),  # mode Off: nothing reserved
        ({"preemption": TPS}, (16, 16)),  # the SLO mode starts at A
        ({"preemption": TPS, "engine": {"maxNumActiveRequests": 40}}, (40, 40)),
        ({"preemption": TPS, "tuning": {"pausedCap": {"max": 4}}}, (4, 4)),
        ({"preemption": TPS, "tuning": {"residentHeadroom": {"max": 3}}}, (3, 3)),
        ({"preemption": TPOT}, (6, 6)),  # floor(0.375 * 16)
        ({"preemption": TPOT, "engine": {"maxNumActiveRequests": 40}}, (15, 15)),
        ({"preemption": TPOT, "tuning": {"pausedCap": {"min": 8}}}, (8, 8)),
        ({"preemption": TPOT, "tuning": {"residentHeadroom": {"min": 10}}}, (10, 6)),
    ],
)
def test_start_knobs(fields: dict[str, Any], knobs: tuple[int, int]) -> None:
    assert GenPoolSpec.from_body(fields).start_knobs() == Knobs(*knobs)


def test_unset_cap_max_follows_a_lower_headroom_max() -> None:
    spec = spec_of(tuning={"residentHeadroom": {"max": 4}})
    assert spec.bounds() == KnobBounds(0, 4, 0, 4)


def test_worker_config_target_output_tps() -> None:
    spec = spec_of(
        model="synthetic:x",
        accelerator="none",
        preemption={**TPS, "slackSeconds": 1.5},
        tuning={"intervalSeconds": 10},
    )
    config = spec.worker_config()
    assert config["device"] == "cpu" and config["preemption_mode"] == "target_output_tps"
    assert config["target_output_tps"] == 8 and "tpot_budget" not in config
    assert config["max_resident_headroom"] == 16
    assert (config["resident_headroom"], config["paused_cap"]) == (16, 16)  # A
    assert config["stat_interval_s"] == 10.0 and config["slack_s"] == 1.5
    assert spec.live_config() == {
        "slack_s": 1.5,
        "admission_target_min_s": 0.25,
        "admission_target_max_s": 30.0,
    }


def test_worker_config_mode_off_reserves_no_headroom() -> None:
    config = spec_of(preemption={"mode": "Off", "tpotBudget": 0.2}).worker_config()
    assert config["preemption_mode"] == "off" and "tpot_budget" not in config
    assert config["max_resident_headroom"] == 0 and config["device"] == "cuda"


@pytest.mark.parametrize("case", INVALID_GENPOOLS, ids=lambda case: case.name)
def test_invalid_specs_are_rejected_with_a_clear_message(case: InvalidGenPool) -> None:
    with pytest.raises(GenPoolSpecError) as raised:
        GenPoolSpec.from_body(case.spec)
    assert case.model_error in str(raised.value)
    assert str(raised.value).startswith("spec")


def test_enough_invalid_cases() -> None:
    assert len(INVALID_GENPOOLS) >= 18
    assert len({case.name for case in INVALID_GENPOOLS}) == len(INVALID_GENPOOLS)


def test_errors_name_every_problem() -> None:
    with pytest.raises(GenPoolSpecError) as raised:
        GenPoolSpec.from_body({"replicas": 999, "engine": {"maxSeqLen": 1}})
    lines = str(raised.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["spec.replicas", "spec.engine.maxSeqLen"]
