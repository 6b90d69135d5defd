"""Every EOS id a checkpoint defines, and its context read before the weights load.

HF directories: the tokenizer's EOS, ``generation_config.json``'s and ``config.json``'s
``eos_token_id`` (an id or a list); GGUF files: ``tokenizer.ggml.eos_token_id`` and the
end-of-turn / end-of-message ids when present. Junk in any of them is refused at load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from genpool_worker.model import LlamaConfig, LlamaModel, ModelLoadError
from genpool_worker.model.config import parse_eos_ids
from genpool_worker.model.gguf_file import GGUFLoadError, read_gguf
from genpool_worker.model.gguf_weights import find_smollm2_gguf, gguf_context, read_config
from genpool_worker.model.hf_config import hf_context, read_hf_config, tokenizer_eos_id
from tests.model.hf_checkpoints import edit_config, make_checkpoint

WHERE = "generation_config.json: 'eos_token_id'"


@pytest.mark.parametrize(
    ("value", "ids"),
    [(2, (2,)), ([2], (2,)), ([128009, 128001, 128009], (128009, 128001)), (None, ()),
     ([], ()), (0, (0,))],
)  # fmt: skip
def test_eos_ids_parse_from_an_id_a_list_or_nothing(value: object, ids: tuple[int, ...]) -> None:
    assert parse_eos_ids(value, WHERE) == ids


@pytest.mark.parametrize("junk", ["2", 2.0, True, [2, "3"], [2, None], -1, [[2]], {"id": 2}])
def test_junk_eos_ids_are_refused_naming_the_key(junk: object) -> None:
    with pytest.raises(ModelLoadError, match=r"generation_config\.json: 'eos_token_id' must be"):
        parse_eos_ids(junk, WHERE)


def _config(**changes: Any) -> LlamaConfig:
    fields: dict[str, Any] = dict(
        num_layers=1, hidden_size=8, ffn_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
        rope_base=1e4, rms_eps=1e-5, vocab_size=10, context_length=32, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    return LlamaConfig(**(fields | changes))


def test_the_config_lists_the_primary_eos_first_once() -> None:
    assert _config().eos_token_ids == (2,)
    assert _config(eos_token_ids=(7, 2, 7)).eos_token_ids == (2, 7)
    with pytest.raises(ModelLoadError, match=r"EOS token ids \[12\] are outside the vocabulary"):
        _config(eos_token_ids=(12,))


def test_an_hf_checkpoint_gathers_the_eos_of_every_file(tmp_path: Path) -> None:
    """Llama 3 Instruct's shape: the tokenizer's EOS, a second one in generation_config."""
    make_checkpoint(tmp_path, "smollm2")
    tokenizer_eos = tokenizer_eos_id(tmp_path)
    assert tokenizer_eos == 2  # <|im_end|>
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    edit_config(tmp_path, eos_token_id=[4, 2])
    config, _ = read_hf_config(tmp_path, eos_token_id=tokenizer_eos)
    assert (config.eos_token_id, config.eos_token_ids) == (2, (2, 9, 4))
    model = LlamaModel.from_hf_dir(tmp_path, max_seq_len=16)
    assert (model.eos_token_id, model.eos_token_ids) == (2, (2, 9, 4))
    # Without a tokenizer EOS the first listed id is the primary; a plain int is read too.
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    edit_config(tmp_path, eos_token_id=None)
    config, _ = read_hf_config(tmp_path)
    assert config.eos_token_ids == (9,)


@pytest.mark.parametrize(
    ("generation", "config_eos", "match"),
    [
        ({"eos_token_id": "<|eot_id|>"}, 2, r"generation_config\.json: 'eos_token_id' must be"),
        ({}, [2, 1.5], r"config\.json: 'eos_token_id' must be"),
        ({}, None, "no EOS token id in the tokenizer, generation_config.json or config.json"),
        ({"eos_token_id": [2, 500]}, 2, r"EOS token ids \[500\] are outside the vocabulary"),
    ],
)
def test_bad_or_missing_eos_ids_fail_at_load(
    tmp_path: Path, generation: dict[str, Any], config_eos: object, match: str
) -> None:
    make_checkpoint(tmp_path, "qwen2")
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    edit_config(tmp_path, eos_token_id=config_eos)
    with pytest.raises(ModelLoadError, match=match):
        read_hf_config(tmp_path)


def test_an_hf_context_is_max_position_embeddings_or_a_shorter_window(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "mistral")
    edit_config(tmp_path, max_position_embeddings=1024)
    assert hf_context(tmp_path) == (1024, "config.json max_position_embeddings")
    edit_config(tmp_path, sliding_window=512)
    assert hf_context(tmp_path) == (512, "config.json sliding_window")
    edit_config(tmp_path, sliding_window=4096)
    assert hf_context(tmp_path)[0] == 1024


def test_smollm2_gguf_eos_and_context_from_its_metadata() -> None:
    path = find_smollm2_gguf()
    config = read_config(read_gguf(path))
    assert (config.eos_token_id, config.eos_token_ids) == (2, (2,))  # <|im_end|>, no eot key
    assert gguf_context(path) == (config.context_length, "llama.context_length")
    assert config.context_length == 8192


def _write_metadata_gguf(path: Path, **token_ids: int) -> None:
    """A llama GGUF header without tensors: every key read_config reads, a vocabulary (a
    string array whose length alone is read), a float and a bool among them."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_block_count(1)
    writer.add_context_length(1024)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(8)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(1e4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_add_bos_token(False)
    writer.add_token_list([f"t{i}" for i in range(12)])
    writer.add_token_scores([0.0] * 12)
    writer.add_bos_token_id(1)
    for kind, token in token_ids.items():
        getattr(writer, f"add_{kind}_token_id")(token)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_with_end_of_turn_ids_stops_on_each(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_metadata_gguf(path, eos=2, eot=7, eom=8)
    config = read_config(read_gguf(path))
    assert (config.eos_token_id, config.eos_token_ids) == (2, (2, 7, 8))
    assert config.vocab_size == 12  # from the token list: the key is absent
    assert gguf_context(path) == (1024, "llama.context_length")
    _write_metadata_gguf(path, eos=2, eot=2)
    assert read_config(read_gguf(path)).eos_token_ids == (2,)


def test_a_file_that_is_not_gguf_is_refused_naming_it(tmp_path: Path) -> None:
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFLoadError, match="is not a readable GGUF file"):
        gguf_context(not_gguf)
    with pytest.raises(GGUFLoadError, match="GGUF file not found"):
        gguf_context(tmp_path / "absent.gguf")
