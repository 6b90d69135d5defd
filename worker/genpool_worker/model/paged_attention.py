"""Decode attention over the paged KV cache on CUDA: one Triton kernel pair, no gather.

The cache is ``kv_cache.KVCache``'s ``[kv_heads, num_blocks + 1, block_size, head_dim]``
per layer; a row's key ``p`` lives at offset ``p % block_size`` of block
``table[p // block_size]``. The kernels address it through its strides
(``cache_geometry``, the one place that knows which dimension is which); head-major,
a block's keys of one head are one contiguous run (16 x 128 bf16: 4 KiB). The torch
path would gather every row's blocks into a contiguous copy first; here each
(row, KV head, split) program maps its keys through the row's block table inside the
kernel and reads them in place, so the bytes read are the batch's true context,
wherever its blocks lie.

Flash-decoding with a fixed number of splits (``NUM_SPLITS``): a batch-1 step would
otherwise run on kv_heads programs only. The grid ``(B, kv_heads, NUM_SPLITS)`` does
not depend on any length, and each program derives its share of the keys from its
row's length read from a device tensor, so the launch has static shapes and one CUDA
graph serves every context length. A second kernel merges the splits by their
log-sum-exp; a split with no keys has lse = -inf and drops out. The query heads that
share a KV head (GQA) are one tile, so each K/V row is read once per group.

A split is ``max(cdiv(length, NUM_SPLITS), MIN_SPLIT)`` keys rounded up to ``BLOCK_N``.
Rounded to ``BLOCK_N`` (not to ``block_size``) because keys are mapped to blocks one by
one: alignment to cache blocks buys nothing, while a split that is a whole number of
``BLOCK_N`` tiles leaves a partial (masked) tile only at the row's end. The floor
``MIN_SPLIT`` (128, the previous kernel's split, measured in docs/results.md) keeps
short contexts at that measured geometry: without it a 200-key row would be cut into
7 one-tile programs, each paying the Q load and a partial-output write for 32 keys.
Up to ``NUM_SPLITS * MIN_SPLIT`` (2048) keys the pieces are the previous kernel's;
beyond, the pieces grow instead of the grid. ``bench/gpu_check.py`` times these
settings against others (its ``attention_sweep``); this kernel has not run on a GPU yet,
so the stored bench/results/gpu_check.json (the previous kernel's) has no such entry.
"""

from __future__ import annotations

import torch

from .triton_compat import tl, triton

NUM_SPLITS = 16  # per (row, KV head): 8 KV heads x 16 = 128 programs, ~the H200's 132 SMs
MIN_SPLIT = 128  # fewest keys in a split (a multiple of BLOCK_N)
BLOCK_N = 32  # keys per inner iteration


def cache_geometry(cache: torch.Tensor) -> tuple[int, int, int, int, int]:
    """``(block_size, kv_heads, block stride, offset stride, head stride)`` of a paged
    cache ``[kv_heads, num_blocks + 1, block_size, head_dim]`` (contiguous last dim)."""
    assert cache.dim() == 4 and cache.stride(3) == 1
    return cache.shape[2], cache.shape[0], cache.stride(1), cache.stride(2), cache.stride(0)


def is_usable(device: torch.device, head_dim: int) -> bool:
    """The kernel needs CUDA, Triton and a power-of-two head_dim >= 16 (all Llamas: 64, 128)."""
    return (
        triton is not None
        and device.type == "cuda"
        and head_dim >= 16
        and head_dim & (head_dim - 1) == 0
    )


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _attend_keys(  # type: ignore[no-untyped-def]
        q,
        k_ptr,
        v_ptr,
        table_ptr,
        head_off,
        start,
        end,
        stride_cb,
        stride_co,
        dims,
        scale,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """Online softmax of ``q`` over the row's keys ``start..end-1``, each found in
        its cache block through ``table_ptr``: running max ``m``, sum ``s`` and the
        unnormalised output ``acc`` per head."""
        m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        s = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        for first in range(start, end, BLOCK):
            keys = first + tl.arange(0, BLOCK)
            key_ok = keys < end
            blocks = tl.load(table_ptr + keys // BLOCK_SIZE, mask=key_ok, other=0)
            rows = blocks.to(tl.int64) * stride_cb + (keys % BLOCK_SIZE) * stride_co
            offs = rows[:, None] + head_off + dims[None, :]
            k = tl.load(k_ptr + offs, mask=key_ok[:, None], other=0.0)
            v = tl.load(v_ptr + offs, mask=key_ok[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            scores = tl.where(key_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(scores - m_new[:, None])
            s = s * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m = m_new
        return m, s, acc

    @triton.jit  # type: ignore[untyped-decorator]
    def _split_kernel(  # type: ignore[no-untyped-def]
        q_ptr,
        k_ptr,
        v_ptr,
        tables_ptr,
        lengths_ptr,
        out_ptr,
        lse_ptr,
        scale,
        stride_t,
        stride_cb,
        stride_co,
        stride_ch,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        NUM_KV: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        SPLITS: tl.constexpr,
        MIN_KEYS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        start, end = _split_range(tl.load(lengths_ptr + row), split, SPLITS, MIN_KEYS, BLOCK)
        heads = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, HEAD_DIM)
        head_ok = heads < GROUP
        q_head = kv_head * GROUP + heads
        # out/lse layout: [rows, heads, splits, (dim)]
        part = (row * NUM_KV * GROUP + q_head) * SPLITS + split
        q_rows = (row * NUM_KV * GROUP + q_head)[:, None] * HEAD_DIM + dims[None, :]
        # An empty split (past the row's length) skips the Q read as well as the keys
        # (a head count, not `& (start < end)`: the interpreter rejects a scalar mask).
        q_ok = heads < tl.where(start < end, GROUP, 0)
        q = tl.load(q_ptr + q_rows, mask=q_ok[:, None], other=0.0)
        table = tables_ptr + row.to(tl.int64) * stride_t
        m, s, acc = _attend_keys(
            q,
            k_ptr,
            v_ptr,
            table,
            kv_head * stride_ch,
            start,
            end,
            stride_cb,
            stride_co,
            dims,
            scale,
            GROUP_PAD,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK,
        )
        _store_partial(out_ptr, lse_ptr, part, dims, head_ok, m, s, acc, HEAD_DIM)

    @triton.jit  # type: ignore[untyped-decorator]
    def _split_range(  # type: ignore[no-untyped-def]
        length, split, SPLITS: tl.constexpr, MIN_KEYS: tl.constexpr, BLOCK: tl.constexpr
    ):
        """Keys ``[start, end)`` of ``split``: a ``SPLITS``-th of the row, at least
        ``MIN_KEYS``, in whole ``BLOCK`` tiles (empty past the row's length)."""
        split_len = tl.maximum(tl.cdiv(length, SPLITS), MIN_KEYS)
        split_len = tl.cdiv(split_len, BLOCK) * BLOCK
        start = split * split_len
        return start, tl.minimum(start + split_len, length)

    @triton.jit  # type: ignore[untyped-decorator]
    def _store_partial(out_ptr, lse_ptr, part, dims, head_ok, m, s, acc, HEAD_DIM: tl.constexpr):  # type: ignore[no-untyped-def]
        """A split's normalised output and log-sum-exp, for the merge."""
        # No key (s == 0): lse = -inf drops the split, and its output is never read.
        has_keys = s > 0
        s_safe = tl.where(has_keys, s, 1.0)
        out_rows = part[:, None] * HEAD_DIM + dims[None, :]
        out_ok = (head_ok & has_keys)[:, None]
        tl.store(out_ptr + out_rows, acc / s_safe[:, None], mask=out_ok)
        tl.store(
            lse_ptr + part, tl.where(has_keys, m + tl.log(s_safe), float("-inf")), mask=head_ok
        )

    @triton.jit  # type: ignore[untyped-decorator]
    def _merge_kernel(  # type: ignore[no-untyped-def]
        part_ptr,
        lse_ptr,
        out_ptr,
        HEAD_DIM: tl.constexpr,
        SPLITS: tl.constexpr,
        SPLITS_PAD: tl.constexpr,
    ):
        row_head = tl.program_id(0)
        splits = tl.arange(0, SPLITS_PAD)
        dims = tl.arange(0, HEAD_DIM)
        ok = splits < SPLITS
        lse = tl.load(lse_ptr + row_head * SPLITS + splits, mask=ok, other=float("-inf"))
        used = ok & (lse > float("-inf"))
        weights = tl.where(used, tl.exp(lse - tl.max(lse, axis=0)), 0.0)
        offs = (row_head * SPLITS + splits)[:, None] * HEAD_DIM + dims[None, :]
        parts = tl.load(part_ptr + offs, mask=used[:, None], other=0.0)
        # A row of length 0 (no split has a key) comes out as zeros, not 0 / 0.
        total = tl.sum(weights, axis=0)
        merged = tl.sum(parts * weights[:, None], axis=0) / tl.where(total > 0, total, 1.0)
        tl.store(out_ptr + row_head * HEAD_DIM + dims, merged.to(out_ptr.dtype.element_ty))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    *,
    num_splits: int = NUM_SPLITS,
    min_split: int = MIN_SPLIT,
) -> torch.Tensor:
    """``softmax(q K^T * scale) V`` of each row over its first ``length`` keys.

    ``q [B, heads, d]``; caches ``[kv_heads, num_blocks + 1, block_size, d]`` (contiguous
    in the last dim, K and V strided alike); ``block_tables`` int32 ``[B, max_blocks]``
    and ``lengths`` int ``[B]`` on the device; row ``i``'s key ``p`` is at offset
    ``p % block_size`` of block ``block_tables[i, p // block_size]``. Returns
    ``[B, heads, d]`` in ``q``'s dtype. ``num_splits``/``min_split``: for benchmarks.
    """
    assert triton is not None
    assert k_cache.stride() == v_cache.stride()
    assert block_tables.stride(1) == 1 and min_split % BLOCK_N == 0
    b, heads, d = q.shape
    block_size, kv_heads, stride_block, stride_offset, stride_head = cache_geometry(k_cache)
    group = heads // kv_heads
    q = q.contiguous()
    parts = torch.empty((b, heads, num_splits, d), device=q.device, dtype=torch.float32)
    lse = torch.empty((b, heads, num_splits), device=q.device, dtype=torch.float32)
    _split_kernel[(b, kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        lengths,
        parts,
        lse,
        scale,
        block_tables.stride(0),
        stride_block,
        stride_offset,
        stride_head,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        NUM_KV=kv_heads,
        HEAD_DIM=d,
        BLOCK_SIZE=block_size,
        SPLITS=num_splits,
        MIN_KEYS=min_split,
        BLOCK=BLOCK_N,
    )
    out = torch.empty_like(q)
    _merge_kernel[(b * heads,)](
        parts,
        lse,
        out,
        HEAD_DIM=d,
        SPLITS=num_splits,
        SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
    )
    return out
