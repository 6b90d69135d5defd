"""A model's EOS set ends a request (after min_tokens) and is never text; --max-seq-len
unset is the model's context, capped, and a given value past it is refused by name."""

from __future__ import annotations

import pytest

from genpool_core.request import FinishReason
from genpool_operator.spec import GenPoolSpec
from genpool_worker.engine_io import Arrival, EngineRequest
from genpool_worker.events import EngineEvent, Finished, TokenDelta
from genpool_worker.output_processor import OutputProcessor
from genpool_worker.worker_args import build_parser
from genpool_worker.worker_config import (
    MAX_SEQ_LEN_CAP,
    MAX_SEQ_LEN_CAP_CUDA,
    SYNTHETIC_MAX_SEQ_LEN,
    MaxSeqLenError,
    WorkerConfig,
    resolve_max_seq_len,
)

EOS = (2, 7)  # Llama 3 Instruct's shape: <|end_of_text|> and <|eot_id|>


class LetterTokenizer:
    """Token i is the letter chr(ord('a') + i), every one of them text (EOS included)."""

    eos_token_id = 2

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def _request(min_tokens: int = 0) -> tuple[EngineRequest, list[EngineEvent]]:
    request = EngineRequest(Arrival("r", [0], max_tokens=8, min_tokens=min_tokens))
    events: list[EngineEvent] = []
    request.emit = events.append  # type: ignore[method-assign]
    return request, events


@pytest.mark.parametrize("eos", EOS)
def test_any_eos_id_stops_a_request_once_min_tokens_are_out(eos: int) -> None:
    request, _ = _request(min_tokens=2)
    request.output_ids = [5]
    assert not request.is_stopped_by(eos, EOS)  # 1 token out: min_tokens holds it
    request.output_ids = [5, eos]
    assert request.is_stopped_by(eos, EOS)
    assert not request.is_stopped_by(9, EOS)


def test_no_eos_id_of_the_set_is_text() -> None:
    output = OutputProcessor(LetterTokenizer(), EOS)
    request, events = _request(min_tokens=4)
    for token in [3, 7, 4, 2, 5, 7]:  # "d", eot (held by min_tokens), "e", eos, "f", eot
        output.on_token(request, token)
    output.on_finished(request, FinishReason.STOP)
    assert "".join(e.text for e in events if isinstance(e, TokenDelta)) == "def"
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.usage.completion_tokens == 6


def test_max_seq_len_is_the_models_context_capped_unless_given() -> None:
    context = (1024, "config.json max_position_embeddings")
    assert resolve_max_seq_len(None, context) == 1024
    assert resolve_max_seq_len(512, context) == 512
    assert resolve_max_seq_len(1024, context) == 1024
    long = (131072, "config.json max_position_embeddings")
    assert resolve_max_seq_len(None, long) == MAX_SEQ_LEN_CAP == 2048
    assert resolve_max_seq_len(None, long, "cuda") == MAX_SEQ_LEN_CAP_CUDA == 8192
    assert resolve_max_seq_len(None, long, "cuda:1") == 8192
    assert resolve_max_seq_len(65536, long, "cpu") == 65536  # given: the cap is no limit
    assert resolve_max_seq_len(None, None) == SYNTHETIC_MAX_SEQ_LEN == 2048
    assert resolve_max_seq_len(100_000, None) == 100_000  # a synthetic model has no context


def test_a_max_seq_len_past_the_context_is_refused_naming_the_flag_and_the_key() -> None:
    with pytest.raises(MaxSeqLenError) as refused:
        resolve_max_seq_len(2048, (1024, "config.json max_position_embeddings"))
    assert str(refused.value) == (
        "--max-seq-len=2048 is more than the model's context of 1024 tokens (config.json"
        " max_position_embeddings); set --max-seq-len <= 1024, or leave it unset for the"
        " model's own"
    )
    assert isinstance(refused.value, ValueError)


def test_the_field_is_unset_by_default_and_its_help_states_the_caps() -> None:
    assert WorkerConfig().max_seq_len is None
    assert WorkerConfig(max_seq_len="512").max_seq_len == 512  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_seq_len"):
        WorkerConfig(max_seq_len=8)
    action = next(a for a in build_parser()._actions if "--max-seq-len" in a.option_strings)
    assert action.help is not None and "(default:" not in action.help
    for said in ("max_position_embeddings", "context_length", "8192 on CUDA", "2048 elsewhere",
                 "synthetic models: 2048"):  # fmt: skip
        assert said in action.help, said


def test_the_operator_still_sets_max_seq_len_explicitly() -> None:
    config = WorkerConfig.model_validate(GenPoolSpec.from_body({}).worker_config())
    assert config.max_seq_len == 2048  # spec.engine.maxSeqLen's default, not the worker's
    worker_json = GenPoolSpec.from_body({"engine": {"maxSeqLen": 4096}}).worker_config()
    assert WorkerConfig.model_validate(worker_json).max_seq_len == 4096
