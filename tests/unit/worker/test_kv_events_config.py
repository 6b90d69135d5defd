"""``--kv-events-config``: vLLM's ``KVEventsConfig`` fields and defaults, a one-line error
naming the flag for anything else, and where the PUB socket binds."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from genpool_worker.kv_events import local_endpoint
from genpool_worker.kv_events_config import KVEventsConfig, binds, parse_kv_events_config
from genpool_worker.worker_args import parse_config
from genpool_worker.worker_config import WorkerConfig

LLMD = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
        "topic": "kv@10.0.0.7:8000@Qwen/Qwen3-8B"}  # fmt: skip


def test_the_defaults_are_vllms() -> None:
    config = parse_kv_events_config("{}")
    assert config.model_dump() == {
        "enable_kv_cache_events": False, "publisher": None, "endpoint": "tcp://*:5557",
        "replay_endpoint": None, "buffer_steps": 10_000, "hwm": 100_000,
        "max_queue_size": 100_000, "topic": "",
    }  # fmt: skip
    assert not config.is_publishing


@pytest.mark.parametrize(
    ("fields", "publishing"),
    [
        ({"enable_kv_cache_events": True}, True),  # an unset publisher is zmq when enabled
        ({"enable_kv_cache_events": True, "publisher": "zmq"}, True),
        ({"enable_kv_cache_events": True, "publisher": "null"}, False),
        ({"publisher": "zmq"}, False),  # not enabled
    ],
)
def test_events_are_published_when_enabled_with_a_zmq_publisher(
    fields: dict[str, object], publishing: bool
) -> None:
    assert KVEventsConfig.model_validate(fields).is_publishing is publishing


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{enable", "--kv-events-config is not valid JSON: Expecting property name"),
        ("[1]", "--kv-events-config must be a JSON object, got list"),
        ('{"enable_kv_cache_event": true}', "enable_kv_cache_event: Extra inputs"),
        ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events: Input should be a valid"),
        ('{"publisher": "kafka"}', "publisher: Input should be 'zmq' or 'null'"),
        ('{"endpoint": "http://x:1"}', "is not a ZeroMQ address"),
        ('{"endpoint": "tcp://*"}', "is not tcp://<host or *>:<port 1-65535>"),
        ('{"endpoint": "tcp://*:70000"}', "is not tcp://<host or *>:<port 1-65535>"),
        ('{"replay_endpoint": "tcp://*:0"}', "replay_endpoint: 'tcp://*:0' is not tcp://"),
        ('{"max_queue_size": 0}', "max_queue_size: Input should be greater than or equal to 1"),
        ('{"hwm": -1}', "hwm: Input should be greater than or equal to 0"),
        ('{"buffer_steps": 1.5}', "buffer_steps: Input should be a valid integer"),
        ('{"topic": 7}', "topic: Input should be a valid string"),
    ],
)
def test_a_bad_config_is_one_line_naming_the_flag(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_kv_events_config(text)
    text_of = str(caught.value)
    assert text_of.startswith("--kv-events-config") and "\n" not in text_of
    assert message in text_of


@pytest.mark.parametrize(
    ("endpoint", "bound"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("inproc://kv", True),
        ("tcp://epp.llm-d.svc:5557", False),  # a central subscriber: connect
        ("tcp://10.0.0.9:5557", False),
    ],
)
def test_wildcards_and_local_transports_bind_the_rest_connect(endpoint: str, bound: bool) -> None:
    assert binds(endpoint) is bound


@pytest.mark.parametrize(
    ("endpoint", "host", "local"),
    [
        ("tcp://*:5557", "10.0.0.7", "tcp://10.0.0.7:5557"),  # the pod IP (--host=$(POD_IP))
        ("tcp://*:5557", "fd00::7", "tcp://[fd00::7]:5557"),
        ("tcp://*:5557", "0.0.0.0", "tcp://*:5557"),
        ("tcp://*:5557", "", "tcp://*:5557"),
        ("tcp://epp:5557", "10.0.0.7", "tcp://epp:5557"),  # connecting: untouched
        ("ipc:///tmp/kv", "10.0.0.7", "ipc:///tmp/kv"),
    ],
)
def test_a_binding_wildcard_is_the_workers_own_address(endpoint: str, host: str,
                                                       local: str) -> None:  # fmt: skip
    assert local_endpoint(endpoint, host) == local


def test_the_flag_sets_the_worker_config() -> None:
    config = parse_config(["--model", "synthetic:x", "--kv-events-config", json.dumps(LLMD)],
                          environ={})  # fmt: skip
    events = config.kv_events()
    assert events is not None and events.is_publishing
    assert events.topic == LLMD["topic"] and events.endpoint == "tcp://*:5557"
    assert parse_config(["--model", "synthetic:x"], environ={}).kv_events() is None


def test_the_env_config_may_hold_the_object_itself() -> None:
    environ = {"GENPOOL_WORKER_CONFIG": json.dumps({"model": "synthetic:x",
                                                     "kv_events_config": LLMD})}  # fmt: skip
    events = parse_config([], environ=environ).kv_events()
    assert events is not None and events.topic == LLMD["topic"]


def test_events_need_the_prefix_cache() -> None:
    with pytest.raises(ValidationError, match="--kv-events-config publishes the prefix cache"):
        WorkerConfig(model="synthetic:x", kv_events_config=json.dumps(LLMD),
                     enable_prefix_caching=False)  # fmt: skip
    off = json.dumps({**LLMD, "enable_kv_cache_events": False})  # nothing published: fine
    WorkerConfig(model="synthetic:x", kv_events_config=off, enable_prefix_caching=False)


def test_a_bad_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    from genpool_worker.worker_cli import main

    assert main(["--model", "synthetic:x", "--kv-events-config", '{"hwm": "lots"}']) == 2
    err = capsys.readouterr().err
    assert err.startswith("genpool-worker: error: kv_events_config: --kv-events-config: hwm:")
    assert err.count("\n") == 1
