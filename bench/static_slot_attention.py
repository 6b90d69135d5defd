"""The pre-paging decode attention kernel, kept only as gpu_check's baseline.

This is ``worker/genpool_worker/model/slot_attention.py`` as it was before the paged
KV cache replaced the static slot cache (``[num_slots + 1, kv_heads, max_seq_len,
head_dim]`` per layer): ``bench/gpu_check_paged.py`` times it against
``paged_attention`` at the same shapes, so the paging change is measured rather than
assumed free. Nothing in the worker imports it. Its original notes follow.

The torch path reads ``[B, kv_heads, max(positions) + 1, head_dim]`` of K and V,
gathered (a copy) when the slots are scattered, for every row of the batch. Here
each (row, KV head, split) program reads its own slot's rows ``0..length-1`` in
place. The grid is sized by ``max_seq_len`` and programs past a row's length return
at once, so the launch has static shapes and can be captured in a CUDA graph.
Flash-decoding: ``SPLIT``-key pieces in parallel, merged by their log-sum-exp; the
query heads sharing a KV head (GQA) are one tile.
"""

from __future__ import annotations

import torch

from genpool_worker.model.triton_compat import tl, triton

SPLIT = 128  # keys per split program
BLOCK_N = 32  # keys per inner iteration


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
        base,
        start,
        end,
        stride_cl,
        dims,
        scale,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """Online softmax of ``q`` over cache rows ``start..end-1`` at ``base``:
        the running max ``m``, sum ``s`` and unnormalised output ``acc`` per head."""
        m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        s = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        for block in range(start, end, BLOCK):
            keys = block + tl.arange(0, BLOCK)
            key_ok = keys < end
            offs = base + keys[:, None] * stride_cl + dims[None, :]
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
        slots_ptr,
        lengths_ptr,
        out_ptr,
        lse_ptr,
        scale,
        stride_cs,
        stride_ch,
        stride_cl,
        num_splits,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        NUM_KV: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        SPLIT_LEN: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        length = tl.load(lengths_ptr + row)
        slot = tl.load(slots_ptr + row)
        start = split * SPLIT_LEN
        heads = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, HEAD_DIM)
        head_ok = heads < GROUP
        q_head = kv_head * GROUP + heads
        # out/lse layout: [rows, heads, splits, (dim)]
        part = (row * NUM_KV * GROUP + q_head) * num_splits + split
        q_rows = (row * NUM_KV * GROUP + q_head)[:, None] * HEAD_DIM + dims[None, :]
        q = tl.load(q_ptr + q_rows, mask=head_ok[:, None], other=0.0)
        base = slot.to(tl.int64) * stride_cs + kv_head * stride_ch
        end = tl.minimum(start + SPLIT_LEN, length)
        m, s, acc = _attend_keys(
            q, k_ptr, v_ptr, base, start, end, stride_cl, dims, scale, GROUP_PAD, HEAD_DIM, BLOCK
        )
        # A split past the row's length ran no iteration (s == 0): lse = -inf drops it.
        has_keys = s > 0
        s_safe = tl.where(has_keys, s, 1.0)
        out_rows = part[:, None] * HEAD_DIM + dims[None, :]
        tl.store(out_ptr + out_rows, acc / s_safe[:, None], mask=head_ok[:, None])
        tl.store(
            lse_ptr + part, tl.where(has_keys, m + tl.log(s_safe), float("-inf")), mask=head_ok
        )

    @triton.jit  # type: ignore[untyped-decorator]
    def _merge_kernel(  # type: ignore[no-untyped-def]
        part_ptr,
        lse_ptr,
        out_ptr,
        num_splits,
        HEAD_DIM: tl.constexpr,
        SPLITS_PAD: tl.constexpr,
    ):
        row_head = tl.program_id(0)
        splits = tl.arange(0, SPLITS_PAD)
        dims = tl.arange(0, HEAD_DIM)
        ok = splits < num_splits
        lse = tl.load(lse_ptr + row_head * num_splits + splits, mask=ok, other=float("-inf"))
        weights = tl.exp(lse - tl.max(lse, axis=0))
        weights = tl.where(ok & (lse > float("-inf")), weights, 0.0)
        offs = (row_head * num_splits + splits)[:, None] * HEAD_DIM + dims[None, :]
        parts = tl.load(part_ptr + offs, mask=(ok & (lse > float("-inf")))[:, None], other=0.0)
        merged = tl.sum(parts * weights[:, None], axis=0) / tl.sum(weights, axis=0)
        tl.store(out_ptr + row_head * HEAD_DIM + dims, merged.to(out_ptr.dtype.element_ty))


def slot_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``softmax(q K^T * scale) V`` of each row over its slot's first ``length`` rows.

    ``q [B, heads, d]``; caches ``[slots + 1, kv_heads, max_seq_len, d]`` (contiguous
    in the last dim); ``slots``/``lengths`` int ``[B]`` on the device. Returns
    ``[B, heads, d]`` in ``q``'s dtype.
    """
    assert triton is not None
    b, heads, d = q.shape
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    num_splits = triton.cdiv(max_len, SPLIT)
    q = q.contiguous()
    parts = torch.empty((b, heads, num_splits, d), device=q.device, dtype=torch.float32)
    lse = torch.empty((b, heads, num_splits), device=q.device, dtype=torch.float32)
    _split_kernel[(b, kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        slots,
        lengths,
        parts,
        lse,
        scale,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        num_splits,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        NUM_KV=kv_heads,
        HEAD_DIM=d,
        SPLIT_LEN=SPLIT,
        BLOCK=BLOCK_N,
    )
    out = torch.empty_like(q)
    _merge_kernel[(b * heads,)](
        parts,
        lse,
        out,
        num_splits,
        HEAD_DIM=d,
        SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
    )
    return out
