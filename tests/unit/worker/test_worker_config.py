"""The worker's config refuses a stat interval its stat line cannot tell apart."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from genpool_core.stat_fields import MIN_STAT_INTERVAL_S
from genpool_core.statline import StatLine, format_statline, parse_statline
from genpool_worker.worker_config import (
    PREFILL_TOKENS_PER_PASS,
    PREFILL_TOKENS_PER_PASS_CUDA,
    WorkerConfig,
    build_scheduler,
)


def test_a_stat_interval_below_the_lines_time_resolution_is_refused() -> None:
    with pytest.raises(ValidationError, match="stat_interval_s"):
        WorkerConfig(stat_interval_s=MIN_STAT_INTERVAL_S / 2)
    assert WorkerConfig(stat_interval_s=MIN_STAT_INTERVAL_S).stat_interval_s == MIN_STAT_INTERVAL_S


def test_windows_that_far_apart_keep_distinct_ends_once_printed() -> None:
    def printed_t(t: float) -> float:
        line = StatLine(t=t, mode="off", residents=0, active=0, paused=0, cap=0, headroom=0,
                        waiters=0)  # fmt: skip
        parsed = parse_statline(format_statline(line))
        assert parsed is not None
        return parsed.t

    ends = [1000.0 + k * MIN_STAT_INTERVAL_S + 0.04 for k in range(50)]
    assert len({printed_t(t) for t in ends}) == len(ends)
    assert printed_t(1000.02) == printed_t(1000.04)  # closer than that: one window's end


def test_the_role_flag_takes_the_roles_core_names() -> None:
    from typing import get_args

    from genpool_core.names import WORKER_ROLES
    from genpool_worker.worker_config import WorkerConfig

    assert get_args(WorkerConfig.model_fields["role"].annotation) == WORKER_ROLES


@pytest.mark.parametrize(
    ("fields", "budget"),
    [
        ({"model": "smollm2-135m"}, PREFILL_TOKENS_PER_PASS),
        ({"model": "smollm2-135m", "device": "cuda"}, PREFILL_TOKENS_PER_PASS_CUDA),
        ({"model": "smollm2-135m", "device": "cuda:1"}, PREFILL_TOKENS_PER_PASS_CUDA),
        ({"model": "smollm2-135m", "max_prefill_tokens_per_pass": 0}, None),  # whole prompts
        ({"model": "smollm2-135m", "max_prefill_tokens_per_pass": 64}, 64),
        ({"model": "synthetic:test"}, None),  # the simulator's GEN worker: prompts come prefilled
        ({"model": "synthetic:test", "max_prefill_tokens_per_pass": 32}, 32),
    ],
)
def test_chunked_prefill_is_on_by_default_for_real_models(
    fields: dict[str, object], budget: int | None
) -> None:
    config = WorkerConfig.model_validate(fields)
    assert config.prefill_budget() == budget
    assert build_scheduler(config).config.max_prefill_tokens_per_pass == budget


def test_a_negative_prefill_budget_is_refused() -> None:
    with pytest.raises(ValidationError, match="max_prefill_tokens_per_pass"):
        WorkerConfig.model_validate({"model": "smollm2-135m", "max_prefill_tokens_per_pass": -1})


@pytest.mark.parametrize(
    ("kv_events_config", "is_recording"),
    [
        (None, False),
        ('{"enable_kv_cache_events": false}', False),
        ('{"enable_kv_cache_events": true, "publisher": "null"}', False),
        ('{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}', True),
    ],
)
def test_the_scheduler_keeps_kv_events_only_for_a_publisher(
    kv_events_config: str | None, is_recording: bool
) -> None:
    fields = {"model": "synthetic:demo", "kv_events_config": kv_events_config}
    config = WorkerConfig.model_validate(fields)
    assert build_scheduler(config).config.record_kv_events is is_recording
