"""Hugging Face checkpoint directories: our model against transformers on the same files.

Each supported architecture (Llama 3.1-style with llama3 RoPE scaling and biases,
SmolLM2-style tied, Mistral with an explicit head_dim, Qwen2 with Q/K/V biases) is
written by transformers with random weights; our float32 model must give the same
logits and the same greedy tokens. Unsupported checkpoints must fail at load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from genpool_worker.model import LlamaModel, ModelLoadError, load_tokenizer
from genpool_worker.model.hf_config import read_hf_config
from genpool_worker.speculative import SpeculativeConfig
from tests.model.hf_checkpoints import (
    ARCHS,
    PROMPTS,
    SCHEDULE_TOKENS,
    edit_config,
    make_checkpoint,
    transformers_greedy,
)
from tests.model.paged import (
    BlockPool,
    interleaved_tables,
    llama_runner,
    paged_runner,
    run_with_pauses,
)
from tests.model.scheduled import EARLY_EXIT, NGRAM, scheduled_greedy, speculating

pytest.importorskip("transformers")

PROMPT = [1, 5, 9, 30, 40, 7, 64, 12]
NEW_TOKENS = 12
# Blocks of 5 (divides neither the prompt lengths nor 64); 3 requests' worth, shuffled.
BLOCK, MAX_LEN = 5, 64
SIZES: dict[str, Any] = {"num_blocks": 3 * MAX_LEN // BLOCK, "block_size": BLOCK}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    directory = tmp_path_factory.mktemp(request.param)
    # Llama 3 is written in shards with an index, as the large checkpoints are.
    shard = "20KB" if request.param == "llama3" else None
    return directory, make_checkpoint(directory, request.param, max_shard_size=shard)


def _greedy(runner: Any, blocks: list[int], prompt: list[int], n: int) -> tuple[list[int], Any]:
    logits = [runner.prefill(blocks, prompt)]
    tokens = [int(logits[0].argmax())]
    for i in range(n - 1):
        tables = [blocks, [runner.kv.dummy_block]]
        step = runner.decode(tables, [tokens[-1], 0], [len(prompt) + i, 0])
        logits.append(step[0])
        tokens.append(int(step[0].argmax()))
    return tokens, torch.stack(logits)


@torch.inference_mode()
def test_logits_and_greedy_tokens_match_transformers(checkpoint: tuple[Path, Any]) -> None:
    directory, hf = checkpoint
    ours = llama_runner(LlamaModel.from_hf_dir, directory, **SIZES, max_seq_len=MAX_LEN)
    assert ours.model.dtype == torch.float32
    (blocks,) = interleaved_tables(ours.kv.num_blocks, BLOCK, [len(PROMPT) + NEW_TOKENS])
    tokens, logits = _greedy(ours, blocks, PROMPT, NEW_TOKENS)
    out = hf.generate(
        torch.tensor([PROMPT]),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
    )
    assert tokens == out[0, len(PROMPT) :].tolist()
    # Teacher-forced logits of the whole sequence: every decode step, not just argmax.
    full = hf(out[:, :-1]).logits[0, len(PROMPT) - 1 :]
    torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_batched_decode_matches_single_requests(checkpoint: tuple[Path, Any]) -> None:
    directory, _ = checkpoint
    ours = llama_runner(LlamaModel.from_hf_dir, directory, **SIZES, max_seq_len=MAX_LEN)
    a, b = PROMPT, [1, 44, 45, 46]
    # Swapped between the solo and the batched run, so each runs over stale blocks.
    table_a, table_b = interleaved_tables(ours.kv.num_blocks, BLOCK, [len(a) + 4, len(b) + 4])
    solo_a = _greedy(ours, table_a, a, 4)[1]
    solo_b = _greedy(ours, table_b, b, 4)[1]
    table_a, table_b = table_b + table_a[2:], table_a[:2]
    la, lb = ours.prefill(table_a, a), ours.prefill(table_b, b)
    ta, tb = int(la.argmax()), int(lb.argmax())
    rows = [torch.stack([la, lb])]
    for i in range(3):
        step = ours.decode([table_a, table_b], [ta, tb], [len(a) + i, len(b) + i])
        rows.append(step)
        ta, tb = int(step[0].argmax()), int(step[1].argmax())
    batched = torch.stack(rows)
    torch.testing.assert_close(batched[:, 0], solo_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched[:, 1], solo_b, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_greedy_with_pauses_paged_and_static_equal_transformers(
    checkpoint: tuple[Path, Any],
) -> None:
    """Several requests generated together (paused in place and resumed, blocks reused,
    padding rows): in scattered blocks of 5 and in the static layout (one block of
    ``max_seq_len`` per request, consecutive), the same tokens as transformers'
    ``generate`` of each prompt alone."""
    directory, hf = checkpoint
    refs = transformers_greedy(hf, PROMPTS, SCHEDULE_TOKENS)
    model = LlamaModel.from_hf_dir(directory, max_seq_len=MAX_LEN)
    paged_kv = paged_runner(model, SIZES["num_blocks"], BLOCK)
    paged, log = run_with_pauses(paged_kv, BlockPool.of(paged_kv), PROMPTS, SCHEDULE_TOKENS)
    assert log.grown
    assert paged == refs
    # The same network over a second cache, in the static layout.
    static_kv = paged_runner(model, 3, MAX_LEN)
    static, _ = run_with_pauses(static_kv, BlockPool.of(static_kv, seed=None), PROMPTS,
                                SCHEDULE_TOKENS)  # fmt: skip
    assert static == paged


@pytest.mark.parametrize("drafter", [NGRAM, EARLY_EXIT], ids=["ngram", "early_exit"])
@torch.inference_mode()
def test_greedy_with_drafts_equals_transformers(
    checkpoint: tuple[Path, Any], drafter: SpeculativeConfig
) -> None:
    """Speculative decoding (n-gram, and the first layer drafting) through the worker's
    scheduler and runner: drafts verified in one forward over scattered blocks
    (Mistral's and Qwen2's attention included) leave each prompt's greedy tokens those
    of transformers."""
    directory, hf = checkpoint
    refs = transformers_greedy(hf, PROMPTS, SCHEDULE_TOKENS)
    model = LlamaModel.from_hf_dir(directory, max_seq_len=MAX_LEN)
    runner = speculating(paged_runner(model, SIZES["num_blocks"], BLOCK), drafter)
    tokens, drafted = scheduled_greedy(runner, PROMPTS, SCHEDULE_TOKENS)
    assert tokens == refs and drafted > 0


def test_tokenizer_from_directory(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "llama3")
    tok = load_tokenizer(tmp_path)
    assert tok.encode("w1 w2") == [1, 6, 7]  # the checkpoint's BOS rule
    chat = tok.apply_chat_template([{"role": "user", "content": "w3"}])
    assert tok.decode(chat, skip_special_tokens=False).split() == [
        "<|im_start|>",
        "user",
        "w3",
        "<|im_end|>",
        "<|im_start|>",
        "assistant",
    ]
    assert tok.eos_token_id == 2
    model = LlamaModel.from_hf_dir(tmp_path, max_seq_len=16)
    assert model.eos_token_id == tok.eos_token_id
    assert model.name == tmp_path.name


def test_load_dispatches_on_directory(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "smollm2")
    model = LlamaModel.load(tmp_path, max_seq_len=16)
    assert model.config.num_layers == 2 and model.config.num_kv_heads == 2


def test_old_style_rope_keys_are_read(tmp_path: Path) -> None:
    """Hub checkpoints spell RoPE as rope_theta + rope_scaling (transformers < 5)."""
    make_checkpoint(tmp_path, "llama3")
    raw = json.loads((tmp_path / "config.json").read_text())
    params = raw.pop("rope_parameters")
    raw["rope_theta"] = params.pop("rope_theta")
    raw["rope_scaling"] = {**params, "type": params.pop("rope_type")}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config, _ = read_hf_config(tmp_path)
    assert config.rope_base == 500000.0
    assert config.rope_scaling is not None and config.rope_scaling.kind == "llama3"
    assert config.rope_scaling.original_context_length == 32


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architecture .* is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
            "rope scaling type 'yarn' is not supported",
        ),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        ({"sliding_window": 8}, "sliding_window=8 is not supported"),
        ({"num_key_value_heads": 3}, "not a multiple of num_kv_heads=3"),
        ({"intermediate_size": 80}, "has shape .* expected"),
    ],
)
def test_unsupported_checkpoints_fail_at_load(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    make_checkpoint(tmp_path, "mistral")
    edit_config(tmp_path, **changes)
    with pytest.raises(ModelLoadError, match=match):
        LlamaModel.from_hf_dir(tmp_path, max_seq_len=16)


def test_unknown_and_missing_tensors_fail_at_load(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    make_checkpoint(tmp_path, "smollm2")
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    extra = {**tensors, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}
    save_file(extra, path)
    with pytest.raises(ModelLoadError, match=r"q_norm\.weight' is not part of a supported"):
        LlamaModel.from_hf_dir(tmp_path, max_seq_len=16)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_up\.weight is missing"):
        LlamaModel.from_hf_dir(tmp_path, max_seq_len=16)


def test_missing_files_fail_at_load(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        LlamaModel.from_hf_dir(tmp_path / "absent", max_seq_len=16)
    make_checkpoint(tmp_path, "qwen2")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"neither model\.safetensors nor"):
        LlamaModel.from_hf_dir(tmp_path, max_seq_len=16)
