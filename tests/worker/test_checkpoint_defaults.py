"""A worker around a Hugging Face checkpoint takes its stops and its context from it:
every EOS id the checkpoint lists ends a request as a stop, with no EOS text, and
``--max-seq-len`` defaults to the model's own context (capped), refused past it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from genpool_core.termination import TERMINATION_LOG_ENV
from genpool_core.worker_env import WORKER_CONFIG_ENV
from genpool_worker.model.tokenizer import load_tokenizer
from genpool_worker.worker_cli import main, model_max_seq_len
from genpool_worker.worker_config import (
    MAX_SEQ_LEN_CAP,
    MAX_SEQ_LEN_CAP_CUDA,
    SYNTHETIC_MAX_SEQ_LEN,
    WorkerConfig,
)
from tests.model.hf_checkpoints import edit_config, make_checkpoint, transformers_greedy
from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]
PROMPT = "w1 w2 w3"
CONTEXT = 1024  # max_position_embeddings, below the CPU default cap
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A tiny SmolLM2-style checkpoint with a 1024-token context, and its greedy tokens
    after PROMPT (transformers', to EOS 2 or MAX_TOKENS)."""
    directory = tmp_path_factory.mktemp("ckpt")
    hf = make_checkpoint(directory, "smollm2")
    edit_config(directory, max_position_embeddings=CONTEXT)
    ids = load_tokenizer(directory).encode(PROMPT)
    return directory, transformers_greedy(hf, [ids], MAX_TOKENS)[0]


def _second_eos(greedy: list[int]) -> int:
    """Where the greedy text can end on a new id: the first one not seen before it."""
    for i, token in enumerate(greedy[1:], 1):
        if token not in greedy[:i] and token > 4:  # past the tokenizer's specials
            return i
    raise AssertionError(f"no fresh token in {greedy}")


def test_a_second_eos_in_generation_config_ends_the_reply_as_a_stop(
    checkpoint: tuple[Path, list[int]], worker_factory: Factory
) -> None:
    directory, greedy = checkpoint
    at = _second_eos(greedy)
    eot = greedy[at]
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, eot]}))
    tokenizer = load_tokenizer(directory)
    worker = worker_factory(model=str(directory), max_batch_size=2)
    info = worker.engine.model_info
    assert info.eos_token_ids == (2, eot)
    assert info.max_seq_len == CONTEXT  # the model's own context: the default started
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    with worker.client() as client:
        reply = client.post("/v1/completions", json=body).json()
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "stop", reply
        assert reply["usage"]["completion_tokens"] == at + 1  # the EOS token counts
        assert choice["text"] == tokenizer.decode(greedy[:at])
        assert tokenizer.decode([eot]) not in choice["text"].split()  # no EOS text
        chunks = []
        with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line.removeprefix("data: "))["choices"][0])
        assert "".join(c["text"] for c in chunks) == choice["text"]
        assert chunks[-1]["finish_reason"] == "stop"
        # min_tokens holds for every EOS id: the second one does not end it early.
        held = client.post("/v1/completions", json=body | {"min_tokens": at + 2}).json()
        assert held["usage"]["completion_tokens"] >= at + 2, held
        assert tokenizer.decode([eot]) not in held["choices"][0]["text"].split()


def test_max_seq_len_defaults_to_the_models_context_and_is_refused_past_it(
    checkpoint: tuple[Path, list[int]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    directory, _ = checkpoint
    assert model_max_seq_len(WorkerConfig(model=str(directory))) == CONTEXT
    assert model_max_seq_len(WorkerConfig(model=str(directory), max_seq_len=512)) == 512
    log = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(log))
    assert main(["--model", str(directory), "--max-seq-len", "2048"]) == 2
    err = capsys.readouterr().err
    expected = (
        "--max-seq-len=2048 is more than the model's context of 1024 tokens"
        " (config.json max_position_embeddings)"
    )
    assert err.startswith("genpool-worker: error: ") and expected in err
    assert log.read_text().startswith(f"invalid worker configuration: {expected}")
    # The operator's worker.json sets max_seq_len (spec.engine.maxSeqLen): the same check.
    config = {"model": str(directory), "max_seq_len": 4096}
    monkeypatch.setenv(WORKER_CONFIG_ENV, json.dumps(config))
    assert main([]) == 2
    assert "--max-seq-len=4096 is more than the model's context" in capsys.readouterr().err


def test_the_packaged_and_synthetic_models_defaults() -> None:
    """SmolLM2's GGUF says 8192 (read from its header, no weights loaded): capped."""
    assert model_max_seq_len(WorkerConfig()) == MAX_SEQ_LEN_CAP == 2048
    assert model_max_seq_len(WorkerConfig(device="cuda")) == MAX_SEQ_LEN_CAP_CUDA == 8192
    assert model_max_seq_len(WorkerConfig(max_seq_len=8192)) == 8192
    assert model_max_seq_len(WorkerConfig(model="synthetic:x")) == SYNTHETIC_MAX_SEQ_LEN
    assert model_max_seq_len(WorkerConfig(model="synthetic:x", max_seq_len=99)) == 99
