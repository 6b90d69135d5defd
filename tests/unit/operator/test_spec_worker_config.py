"""The operator's worker.json is a config the worker accepts. The worker's config module is
torch-free, so this runs in the unit tier (whose import blocker keeps it so)."""

from __future__ import annotations

from typing import Any

import pytest

from genpool_operator.spec import GenPoolSpec
from genpool_worker.worker_config import WorkerConfig, build_scheduler

TPS = {"mode": "TargetOutputTps", "targetOutputTps": 8}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"preemption": TPS},
        {"preemption": {"mode": "TpotBudget", "tpotBudget": 0.1}},
        {"preemption": TPS, "engine": {"maxBatchSize": 8, "maxNumActiveRequests": 24},
         "tuning": {"residentHeadroom": {"min": 2, "max": 12}, "pausedCap": {"max": 10}}},
    ],
)  # fmt: skip
def test_the_worker_accepts_worker_config(fields: dict[str, Any]) -> None:
    worker_json = GenPoolSpec.from_body(fields).worker_config()
    config = WorkerConfig.model_validate({**worker_json, "device": "cpu"})
    build_scheduler(config)  # raises on a capacity or preemption rule the worker enforces
