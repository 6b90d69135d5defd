"""The pure parts of ``python -m genpool_devcluster.interop precise-prefix``: the GenPool it
applies (as the operator reads it), the pods it waits for, the epp's configuration with
and without Kubernetes, and what it reads of the epp's log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from genpool_devcluster.interop.cli import _parser
from genpool_devcluster.interop.precise_prefix import MODES, RESULTS, pool_spec, ready_pods
from genpool_devcluster.interop.prefix_epp import (
    EppWatch,
    last_run,
    precise_prefix_config,
    subscribed_endpoints,
)
from genpool_operator.spec import GenPoolSpec


@pytest.mark.parametrize("events", [True, False])
def test_the_pool_is_a_valid_genpool_with_events_as_asked(events: bool) -> None:
    spec = GenPoolSpec.from_body(pool_spec("synthetic:interop", 16, events))
    assert spec.replicas == 2 and spec.engine.kv_block_size == 16
    assert spec.engine.enable_prefix_caching and spec.inference_pool.enabled
    config = spec.kv_events_config()
    if not events:
        assert config is None
        return
    assert config is not None
    flag = json.loads(config)
    # the topic's model is what the load sends as "model": llm-d keys its index by it
    assert flag["topic"] == "kv@$(POD_IP):8000@synthetic:interop"
    assert flag["endpoint"] == "tcp://*:5557"


def test_a_real_model_asks_for_a_core() -> None:
    assert pool_spec("smollm2-135m", 16, True)["resources"]["requests"]["cpu"] == "1"
    assert pool_spec("synthetic:x", 16, True)["resources"]["requests"]["cpu"] == "100m"


def _pod(name: str, ip: str | None, ready: bool, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status,
            "spec": {"containers": [{"name": "worker", "args": ["--host=$(POD_IP)"]}]}}  # fmt: skip


def test_ready_pods_are_the_ready_ones_with_an_ip_not_being_deleted() -> None:
    items = [
        _pod("p-worker-1", "127.0.0.13", True),
        _pod("p-worker-0", "127.0.0.12", True),
        _pod("p-worker-2", "127.0.0.14", False),
        _pod("p-worker-3", None, True),
        _pod("p-worker-4", "127.0.0.15", True, deleting=True),
    ]
    pods = ready_pods(items)
    assert list(pods) == ["p-worker-0", "p-worker-1"]
    assert pods["p-worker-0"] == {"ip": "127.0.0.12", "args": ["--host=$(POD_IP)"]}


def test_kubernetes_config_leaves_discovery_to_the_epp() -> None:
    config = json.loads(precise_prefix_config("m", "http://127.0.0.12:8000", 16, 5557))
    types = [p["type"] for p in config["plugins"]]
    assert "file-discovery" not in types and "discovery" not in config["dataLayer"]
    assert config["dataLayer"]["injectDefaults"] is False
    producer = next(p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer")
    params = producer["parameters"]
    assert params["tokenProcessorConfig"] == {"blockSizeTokens": 16}
    assert params["kvEventsConfig"]["podDiscoveryConfig"] == {"socketPort": 5557}
    token = next(p for p in config["plugins"] if p["type"] == "token-producer")
    assert token["parameters"] == {"modelName": "m", "vllm": {"url": "http://127.0.0.12:8000"}}


def test_file_discovery_config_names_its_plugin_and_the_replay_port() -> None:
    discovery = {"name": "fd", "type": "file-discovery", "parameters": {"path": "/x"}}
    config = json.loads(precise_prefix_config("m", "http://a", 16, 5557, replay_port=5558,
                                              discovery=discovery))  # fmt: skip
    assert config["plugins"][0] == discovery
    assert config["dataLayer"]["discovery"] == {"pluginRef": "fd"}
    producer = next(p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer")
    pod_discovery = producer["parameters"]["kvEventsConfig"]["podDiscoveryConfig"]
    assert pod_discovery == {"socketPort": 5557, "replaySocketPort": 5558}


def _line(**record: Any) -> str:
    return json.dumps({"level": "debug", **record})


def test_subscribed_endpoints_are_the_last_runs(tmp_path: Path) -> None:
    log = tmp_path / "epp.log"
    old = _line(msg="Adding subscriber", endpoint="ns/old-worker-0-rank-0")
    new = [_line(msg="Adding subscriber", endpoint=f"ns/p-worker-{i}-rank-0") for i in (0, 1)]
    other = _line(msg="Ensured KV-events subscriber", endpoint="ns/elsewhere")
    log.write_text(f"\n==== t0 epp\n{old}\n\n==== t1 epp\n{new[0]}\n{other}\nnot json\n{new[1]}\n")
    assert subscribed_endpoints(log) == {"ns/p-worker-0-rank-0", "ns/p-worker-1-rank-0"}
    assert last_run("no header yet") == "no header yet"


def test_replays_are_named_by_the_worker_urls_host(tmp_path: Path) -> None:
    log = tmp_path / "epp.log"
    lines = [_line(msg="Replay complete", replayEndpoint=f"tcp://{host}:5558", replayed=n)
             for host, n in (("127.0.0.13", 4), ("127.0.0.12", 2))]  # fmt: skip
    log.write_text("\n==== t epp\n" + "\n".join(lines) + "\n")
    workers = {"a-rank-0": "http://127.0.0.12:8000", "b-rank-0": "http://127.0.0.13:8000"}
    watch = EppWatch("http://unused/metrics", workers, log)
    assert watch.replayed() == {"a-rank-0": 2, "b-rank-0": 4}


def test_cli_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    args = _parser().parse_args(["precise-prefix", "--bin", "/b"])
    assert args.runs == ",".join(MODES) == "events,control"
    assert args.out == RESULTS and args.block_size == 16 and args.model == "synthetic:interop"
    assert args.state_dir == Path("/home/someone/.cache/genpool/devcluster/run")
    args = _parser().parse_args(["precise-prefix", "--bin", "/b", "--state-dir", "~/s"])
    assert args.state_dir == Path("/home/someone/s")
