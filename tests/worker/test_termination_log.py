"""The worker's fatal error reaches the termination log: the cause on the first line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import genpool_worker.termination_log as termination_log
from genpool_core.termination import MAX_TERMINATION_MESSAGE_BYTES, TERMINATION_LOG_ENV
from genpool_worker.multirank import free_port
from genpool_worker.termination_log import report_fatal
from genpool_worker.worker_cli import main
from tests.polling import wait_for


@pytest.fixture
def log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(path))
    return path


def test_a_refused_configuration_is_the_first_line(log_file: Path) -> None:
    assert main(["--model", "synthetic:x", "--max-batch-size", "0"]) == 2
    first = log_file.read_text().splitlines()[0]
    assert first.startswith("invalid worker configuration: max_batch_size: ")


def test_tensor_parallel_size_the_model_refuses_names_its_kv_heads(log_file: Path) -> None:
    assert main(["--model", "smollm2-135m", "--tensor-parallel-size", "2"]) == 2
    first = log_file.read_text().splitlines()[0]
    assert "tensor_parallel_size=2" in first and "3 KV heads" in first


def test_a_drafter_the_model_cannot_run_is_a_refused_configuration(log_file: Path) -> None:
    early_exit = '{"method": "early_exit", "num_speculative_tokens": 2, "num_draft_layers": 4}'
    assert main(["--model", "synthetic:x", "--speculative-config", early_exit]) == 2
    first = log_file.read_text().splitlines()[0]
    assert first.startswith("invalid worker configuration: speculative method early_exit")


def test_a_model_that_fails_to_load_is_reported_with_its_traceback(
    log_file: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.gguf"
    assert main(["--model", str(missing), "--device", "cpu"]) == 1
    text = log_file.read_text()
    assert text.splitlines()[0] == f"GGUFLoadError: GGUF file not found: {missing}"
    assert "Traceback" in text and len(text.encode()) <= MAX_TERMINATION_MESSAGE_BYTES


def test_the_first_fatal_error_wins(log_file: Path) -> None:
    assert report_fatal("tensor-parallel rank 1: ValueError: bad shard")
    assert not report_fatal("tensor-parallel rank 1 exited with code 1")
    assert log_file.read_text() == "tensor-parallel rank 1: ValueError: bad shard\n"


def test_the_message_is_bounded(log_file: Path) -> None:
    assert report_fatal("cause", "x" * 10_000)
    assert len(log_file.read_bytes()) == MAX_TERMINATION_MESSAGE_BYTES


def test_outside_a_pod_nothing_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TERMINATION_LOG_ENV, raising=False)
    absent = tmp_path / "dev" / "termination-log"  # as /dev/termination-log off a kubelet
    monkeypatch.setattr(termination_log, "DEFAULT_TERMINATION_LOG", str(absent))
    assert not report_fatal("cause")
    assert not absent.exists()
    absent.parent.mkdir()
    absent.write_bytes(b"")  # the kubelet's mount: an empty file
    assert report_fatal("cause")
    assert absent.read_text() == "cause\n"


def test_a_dead_tensor_parallel_rank_is_the_workers_cause(log_file: Path) -> None:
    port = free_port()
    env = {**os.environ, TERMINATION_LOG_ENV: str(log_file)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "genpool_worker.worker_cli", "--model", "synthetic:tp",
         "--tensor-parallel-size", "2", "--port", str(port), "--synthetic-time-scale", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: _ready(port), "the worker ready", 60)
        rank_1 = subprocess.run(["pgrep", "-P", str(worker.pid), "-f", "spawn_main"],
                                capture_output=True, text=True, check=True)  # fmt: skip
        os.kill(int(rank_1.stdout.split()[0]), signal.SIGKILL)
        assert worker.wait(timeout=30) != 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert log_file.read_text() == "tensor-parallel rank 1 exited with code -9\n"


def _ready(port: int) -> bool:
    with contextlib.suppress(httpx.TransportError):  # not listening yet
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200
    return False
