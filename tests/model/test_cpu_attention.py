"""The CPU decode kernel (``cpu_attention``) against torch's attention, and when it runs.

The kernel maps each key through its row's block table and reads it in place; the
reference gathers the same keys and runs float64 matmuls and a softmax. Tables are
shuffled blocks, lengths end mid-block, on a boundary, and at one key (a batch padding
row in the dummy block), with GQA groups of 3 as SmolLM2's.
"""

from __future__ import annotations

import random

import pytest
import torch

from genpool_worker.model import KVCache, cpu_attention
from genpool_worker.model.config import LlamaConfig
from genpool_worker.model.cpu_attention import InPlaceRows
from genpool_worker.model.kv_cache import GatheredRows

KV_HEADS, GROUP, DIM, BLOCK = 3, 3, 64, 16
NUM_BLOCKS = 40


def _cache(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((KV_HEADS, NUM_BLOCKS + 1, BLOCK, DIM), generator=generator)


def _reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tables: list[list[int]],
    lengths: list[int],
    scale: float,
) -> torch.Tensor:
    out = torch.empty_like(q)
    for row, (table, length) in enumerate(zip(tables, lengths, strict=True)):
        keys = torch.stack([k[:, table[p // BLOCK], p % BLOCK] for p in range(length)], 1)
        values = torch.stack([v[:, table[p // BLOCK], p % BLOCK] for p in range(length)], 1)
        scores = q[row].double() @ keys.double().transpose(-1, -2) * scale  # [kv, group, L]
        out[row] = (scores.softmax(-1) @ values.double()).float()
    return out


def _tables(rng: random.Random, lengths: list[int]) -> list[list[int]]:
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    return [[free.pop() for _ in range(-(-n // BLOCK))] for n in lengths]


def test_the_kernel_equals_torch_over_shuffled_blocks() -> None:
    rng = random.Random(5)
    lengths = [1, 15, 16, 17, 100, 160]  # a key, in the first block, on and past its end
    tables = [*_tables(rng, lengths), [NUM_BLOCKS]]  # + a padding row: the dummy block
    lengths.append(1)
    k, v = _cache(1), _cache(2)
    q = torch.randn((len(tables), KV_HEADS, GROUP, DIM))
    rows = InPlaceRows.of(tables, lengths, BLOCK, NUM_BLOCKS)
    ours = cpu_attention.paged_decode_attention(q, k, v, rows, DIM**-0.5)
    ref = _reference(q, k, v, tables, lengths, DIM**-0.5)
    assert ours.shape == ref.shape and ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_the_kernel_reads_no_key_past_a_rows_length() -> None:
    """Every key past each row's length (the rest of its last block, the table's padding,
    other blocks) is NaN: the output stays finite and equal to the clean cache's."""
    rng = random.Random(9)
    lengths = [5, 33, 48]
    tables = _tables(rng, lengths)
    k, v = _cache(3), _cache(4)
    poisoned_k, poisoned_v = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    for table, length in zip(tables, lengths, strict=True):
        for p in range(length):
            at = (slice(None), table[p // BLOCK], p % BLOCK)
            poisoned_k[at], poisoned_v[at] = k[at], v[at]
    q = torch.randn((len(tables), KV_HEADS, GROUP, DIM))
    rows = InPlaceRows.of(tables, lengths, BLOCK, NUM_BLOCKS)
    clean = cpu_attention.paged_decode_attention(q, k, v, rows, 0.125)
    poisoned = cpu_attention.paged_decode_attention(q, poisoned_k, poisoned_v, rows, 0.125)
    assert torch.equal(clean, poisoned)


def test_the_kernels_output_does_not_depend_on_where_the_blocks_are() -> None:
    """The same keys in two placements (shuffled blocks, then consecutive ones) give
    bit-identical outputs: the sums run key by key in one order whatever the layout."""
    length = 70
    width = -(-length // BLOCK)
    scattered = _tables(random.Random(2), [length])
    consecutive = [list(range(width))]
    k, v = _cache(6), _cache(7)
    moved_k, moved_v = k.clone(), v.clone()
    for new, old in zip(consecutive[0], scattered[0], strict=True):
        moved_k[:, new], moved_v[:, new] = k[:, old], v[:, old]
    q = torch.randn((1, KV_HEADS, GROUP, DIM))
    a = cpu_attention.paged_decode_attention(
        q, k, v, InPlaceRows.of(scattered, [length], BLOCK, NUM_BLOCKS), 0.125
    )
    b = cpu_attention.paged_decode_attention(
        q, moved_k, moved_v, InPlaceRows.of(consecutive, [length], BLOCK, NUM_BLOCKS), 0.125
    )
    assert torch.equal(a, b)


def _kv_cache(**options: object) -> KVCache:
    config = LlamaConfig(num_layers=1, hidden_size=KV_HEADS * GROUP * DIM, ffn_size=8,
                         num_heads=KV_HEADS * GROUP, num_kv_heads=KV_HEADS, head_dim=DIM,
                         rope_base=1e4, rms_eps=1e-5, vocab_size=8, context_length=256,
                         bos_token_id=None, eos_token_id=0)  # fmt: skip
    return KVCache(config, num_blocks=NUM_BLOCKS, block_size=BLOCK, kv_heads=KV_HEADS,
                   device=torch.device("cpu"), **options)  # type: ignore[arg-type]  # fmt: skip


def test_a_cache_reads_in_place_where_the_kernel_wins_and_gathers_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = [[0, 1], [2]]
    wide = [[i] for i in range(cpu_attention.MAX_THREADED_ROWS + 1)]
    cache = _kv_cache(dtype=torch.float32)
    assert cache.decodes_in_place  # float32 on the CPU, numba installed
    rows = cache.decode_rows(small, [20, 3])
    assert isinstance(rows.reads, InPlaceRows)
    assert rows.reads.tables.tolist() == [[0, 1], [2, NUM_BLOCKS]]
    assert rows.reads.lengths.tolist() == [21, 4]
    assert rows.written.tolist() == [1 * BLOCK + 4, 2 * BLOCK + 3]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert isinstance(cache.decode_rows(wide, [0] * len(wide)).reads, GatheredRows)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert isinstance(cache.decode_rows(wide, [0] * len(wide)).reads, InPlaceRows)
    off = _kv_cache(dtype=torch.float32, in_place_decode=False)
    assert isinstance(off.decode_rows(small, [20, 3]).reads, GatheredRows)
    assert not _kv_cache(dtype=torch.bfloat16).decodes_in_place
    with pytest.raises(ValueError, match=r"does not run torch\.bfloat16"):
        _kv_cache(dtype=torch.bfloat16, in_place_decode=True)
