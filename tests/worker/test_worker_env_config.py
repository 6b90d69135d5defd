"""GENPOOL_WORKER_CONFIG as the worker's base config, and the preStop drain command."""

from __future__ import annotations

import json
import threading
import time

import pytest

from genpool_worker import drain_cli
from genpool_worker.worker_cli import main, parse_config
from tests.polling import wait_for
from tests.worker.conftest import run_worker

TOKEN = "s3cret"


def test_env_json_is_the_base_config() -> None:
    env = {"GENPOOL_WORKER_CONFIG": json.dumps({"model": "synthetic:x", "max_batch_size": 8})}
    config = parse_config([], env)
    assert config.model == "synthetic:x" and config.max_batch_size == 8


def test_flags_override_the_env_json() -> None:
    env = {"GENPOOL_WORKER_CONFIG": json.dumps({"max_batch_size": 8, "max_seq_len": 512})}
    config = parse_config(["--max-batch-size", "4"], env)
    assert config.max_batch_size == 4 and config.max_seq_len == 512


def test_operator_worker_json_is_accepted() -> None:
    # What the operator's builders write into worker.json, round-tripped through the CLI.
    from genpool_operator.spec import GenPoolSpec

    spec = GenPoolSpec.from_body(
        {"model": "synthetic:x", "preemption": {"mode": "TargetOutputTps", "targetOutputTps": 8}}
    )
    env = {"GENPOOL_WORKER_CONFIG": json.dumps(spec.worker_config())}
    config = parse_config([], env)
    assert config.preemption_mode == "target_output_tps" and config.target_output_tps == 8.0
    assert config.paused_cap == 16 and config.max_resident_headroom == 16  # the SLO mode: A


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "GENPOOL_WORKER_CONFIG is not valid JSON"),
        ("[1, 2]", "GENPOOL_WORKER_CONFIG must be a JSON object, got list"),
        ('{"max_batch_sise": 8}', "max_batch_sise: Extra inputs are not permitted"),
        ('{"max_batch_size": "many"}', "max_batch_size"),
    ],
)
def test_bad_env_config_exits_2_with_a_message(
    raw: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GENPOOL_WORKER_CONFIG", raw)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("genpool-worker: error: ") and message in err
    assert "Traceback" not in err


def _drain_env(url: str, monkeypatch: pytest.MonkeyPatch, token: str | None = TOKEN) -> None:
    host, port = url.removeprefix("http://").split(":")
    monkeypatch.setenv("POD_IP", host)
    monkeypatch.setenv("GENPOOL_PORT", port)
    if token is None:
        monkeypatch.delenv("GENPOOL_ADMIN_TOKEN", raising=False)
    else:
        monkeypatch.setenv("GENPOOL_ADMIN_TOKEN", token)


def test_drain_of_an_idle_worker_exits_0(monkeypatch: pytest.MonkeyPatch) -> None:
    with run_worker(admin_token=TOKEN) as worker:
        _drain_env(worker.url, monkeypatch)
        assert drain_cli.main(["--timeout", "5"]) == 0
        assert worker.engine.is_draining
        with worker.client() as client:
            assert client.get("/ready").status_code == 503


def test_drain_with_a_wrong_token_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with run_worker(admin_token=TOKEN) as worker:
        _drain_env(worker.url, monkeypatch, token="wrong")
        assert drain_cli.main(["--timeout", "5"]) == 1
        assert "HTTP 403" in capsys.readouterr().out
        assert not worker.engine.is_draining


def test_drain_waits_for_inflight_requests_up_to_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with run_worker(admin_token=TOKEN, synthetic_time_scale=1.0) as worker:
        _drain_env(worker.url, monkeypatch)
        # A long request keeps the worker busy past a short drain timeout.
        body = {"prompt": "hello", "max_tokens": 150}
        with worker.client() as client:
            thread = threading.Thread(target=lambda: client.post("/v1/completions", json=body))
            thread.start()
            wait_for(lambda: worker.engine.inflight > 0, "the long request to start", 10,
                     interval=0.02)  # fmt: skip
            started = time.monotonic()
            assert drain_cli.main(["--timeout", "0.5"]) == 1
            assert time.monotonic() - started < 0.5 + drain_cli.CLIENT_MARGIN_S
            thread.join(60)


def test_drain_of_an_absent_worker_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    monkeypatch.setenv("GENPOOL_PORT", "1")  # nothing listens on port 1
    started = time.monotonic()
    assert drain_cli.main(["--timeout", "2"]) == 1
    assert time.monotonic() - started < 2 + drain_cli.CLIENT_MARGIN_S


def test_drain_timeout_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENPOOL_DRAIN_TIMEOUT_S", "7")
    assert drain_cli.default_timeout({"GENPOOL_DRAIN_TIMEOUT_S": "7"}) == 7.0
    assert drain_cli.default_timeout({}) == drain_cli.DEFAULT_TIMEOUT_S
    assert drain_cli.drain_url({}) == "http://127.0.0.1:8000/drain"
    assert drain_cli.drain_url({"POD_IP": "fd00::1"}) == "http://[fd00::1]:8000/drain"
