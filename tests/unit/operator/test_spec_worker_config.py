"""The operator's worker.json is a config the worker accepts. The worker's config module is
torch-free, so this runs in the unit tier (whose import blocker keeps it so)."""

from __future__ import annotations

from typing import Any

import pytest

from genpool_operator.spec import GenPoolSpec, GenPoolSpecError
from genpool_worker.worker_config import WorkerConfig, build_scheduler

TPS = {"mode": "TargetOutputTps", "targetOutputTps": 8}
CPU = {"accelerator": "none"}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"preemption": TPS},
        {"preemption": {"mode": "TpotBudget", "tpotBudget": 0.1}},
        {"preemption": TPS, "engine": {"maxBatchSize": 8, "maxNumActiveRequests": 24},
         "tuning": {"residentHeadroom": {"min": 2, "max": 12}, "pausedCap": {"max": 10}}},
        # each way the KV budget reaches worker.json (genpool_operator.kv_budget)
        CPU,
        {**CPU, "resources": {"limits": {"memory": "3Gi"}}, "engine": {"kvBlockSize": 32}},
        {**CPU, "tensorParallelSize": 3, "resources": {"limits": {"memory": "8Gi"}}},
        {**CPU, "engine": {"kvCacheMemory": "512Mi"}},
        {"engine": {"kvCacheMemory": 8589934592}},
        {"engine": {"gpuMemoryUtilization": 0.75}},
        {**CPU, "engine": {"maxPrefillTokensPerPass": 256}},
        {**CPU, "engine": {"enablePrefixCaching": False}},
    ],
)  # fmt: skip
def test_the_worker_accepts_worker_config(fields: dict[str, Any]) -> None:
    worker_json = GenPoolSpec.from_body(fields).worker_config()
    config = WorkerConfig.model_validate(worker_json)
    build_scheduler(config)  # raises on a capacity or preemption rule the worker enforces


def test_the_worker_reads_the_kv_budget_the_operator_writes() -> None:
    spec = GenPoolSpec.from_body({**CPU, "engine": {"kvCacheMemory": "1Gi", "kvBlockSize": 8}})
    config = WorkerConfig.model_validate(spec.worker_config())
    assert (config.kv_cache_memory, config.kv_block_size) == (1 << 30, 8)
    assert config.gpu_memory_utilization is None
    gpu = WorkerConfig.model_validate(GenPoolSpec.from_body({}).worker_config())
    assert gpu.device == "cuda" and gpu.gpu_memory_utilization == 0.9


def test_chunked_prefill_reaches_the_worker_only_when_asked_for() -> None:
    spec = GenPoolSpec.from_body({**CPU, "engine": {"maxPrefillTokensPerPass": 512}})
    config = WorkerConfig.model_validate(spec.worker_config())
    assert config.max_prefill_tokens_per_pass == 512
    assert build_scheduler(config).config.max_prefill_tokens_per_pass == 512
    assert "max_prefill_tokens_per_pass" not in GenPoolSpec.from_body(CPU).worker_config()


def test_prefix_caching_is_on_unless_the_spec_turns_it_off() -> None:
    on = WorkerConfig.model_validate(GenPoolSpec.from_body(CPU).worker_config())
    assert on.enable_prefix_caching and build_scheduler(on).config.enable_prefix_caching
    spec = GenPoolSpec.from_body({**CPU, "engine": {"enablePrefixCaching": False}})
    off = WorkerConfig.model_validate(spec.worker_config())
    assert not off.enable_prefix_caching and not build_scheduler(off).config.enable_prefix_caching


def test_kv_events_need_the_prefix_cache_and_reach_the_worker_as_its_flag() -> None:
    from genpool_worker.kv_events_config import parse_kv_events_config

    spec = GenPoolSpec.from_body({**CPU, "engine": {"kvEvents": {"enabled": True, "port": 6000}}})
    text = spec.kv_events_config()
    assert text is not None
    config = parse_kv_events_config(text.replace("$(POD_IP)", "10.0.0.7"))
    assert config.is_publishing and config.endpoint == "tcp://*:6000"
    assert config.topic == f"kv@10.0.0.7:8000@{spec.model}"
    assert GenPoolSpec.from_body(CPU).kv_events_config() is None
    for bad in ({"kvEvents": {"enabled": True}, "enablePrefixCaching": False},
                {"kvEvents": {"enabled": True, "port": 8000}}):  # fmt: skip
        with pytest.raises(GenPoolSpecError):
            GenPoolSpec.from_body({**CPU, "engine": bad})


def test_speculative_decoding_reaches_the_worker_as_its_flag() -> None:
    spec = GenPoolSpec.from_body(
        {**CPU, "engine": {"speculative": {"numSpeculativeTokens": 3, "promptLookupMax": 4}}}
    )
    worker_json = spec.worker_config()
    assert worker_json["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
    }  # fmt: skip
    config = WorkerConfig.model_validate(worker_json)
    speculative = config.speculative()
    assert speculative is not None and speculative.lookup_range == (4, 4)
    assert build_scheduler(config).config.num_speculative_tokens == 3
    assert "speculative_config" not in GenPoolSpec.from_body(CPU).worker_config()
    early_exit = {"numSpeculativeTokens": 3, "method": "early_exit", "numDraftLayers": 12}
    early_json = GenPoolSpec.from_body({**CPU, "engine": {"speculative": early_exit}})
    early_config = WorkerConfig.model_validate(early_json.worker_config()).speculative()
    assert early_config is not None and early_config.num_draft_layers == 12
    bad_sections = (
        {}, {"numSpeculativeTokens": 0}, {"numSpeculativeTokens": 2, "method": "eagle"},
        {"numSpeculativeTokens": 2, "promptLookupMin": 5, "promptLookupMax": 2},
        {"numSpeculativeTokens": 2, "method": "early_exit"},
        {"numSpeculativeTokens": 2, "numDraftLayers": 4},
        {**early_exit, "promptLookupMax": 4}, {**early_exit, "numDraftLayers": 0},
    )  # fmt: skip
    for bad in bad_sections:
        with pytest.raises(GenPoolSpecError):
            GenPoolSpec.from_body({**CPU, "engine": {"speculative": bad}})
