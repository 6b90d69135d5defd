"""RMSNorm and SiLU-gate as single Triton kernels, for the CUDA decode path.

In a CUDA-graphed batch-1 decode step the weight GEMVs are the only work worth
its launch; torch's half-precision RMSNorm (to float32, normalise, round, scale)
is four kernels and SiLU-gate two, ~200 of a step's ~700 launches on an 8B Llama,
each a few microseconds however small. Each is one kernel here, with the rounding
steps of transformers' bf16 modules kept (normalise in float32, round to the model
dtype, then scale; SiLU rounded before the product), so the numbers do not move.
"""

from __future__ import annotations

import torch

from .paged_attention import cache_geometry
from .triton_compat import tl, triton

SILU_BLOCK = 1024


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, hidden, eps, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < hidden
        x = tl.load(x_ptr + row * hidden + cols, mask=ok, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
        normed = (x * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * hidden + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit  # type: ignore[untyped-decorator]
    def _silu_mul_kernel(gate_up_ptr, out_ptr, ffn, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < ffn
        gate = tl.load(gate_up_ptr + row * 2 * ffn + cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(gate_up_ptr + row * 2 * ffn + ffn + cols, mask=ok, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * ffn + cols, (act * up).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit  # type: ignore[untyped-decorator]
    def _rope_cache_kernel(  # type: ignore[no-untyped-def]
        qkv_ptr,
        cos_ptr,
        sin_ptr,
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        slot_mapping_ptr,
        pos_ptr,
        stride_cb,
        stride_co,
        stride_ch,
        NUM_HEADS: tl.constexpr,
        NUM_KV: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)  # 0..heads-1: Q, then K heads, then V heads
        dims = tl.arange(0, HEAD_DIM)
        pos = tl.load(pos_ptr + row)
        token = tl.load(slot_mapping_ptr + row).to(tl.int64)  # flat token row of the cache
        src = qkv_ptr + (row * (NUM_HEADS + 2 * NUM_KV) + head) * HEAD_DIM
        x = tl.load(src + dims)
        if head < NUM_HEADS + NUM_KV:
            # rotate_half(x) == roll(x, d/2) with the sign folded into the sin table;
            # each product rounded to the model dtype, as the torch expression does.
            partner = tl.load(src + (dims + HEAD_DIM // 2) % HEAD_DIM)
            cos = tl.load(cos_ptr + pos * HEAD_DIM + dims)
            sin = tl.load(sin_ptr + pos * HEAD_DIM + dims)
            a = (x.to(tl.float32) * cos.to(tl.float32)).to(x.dtype)
            b = (partner.to(tl.float32) * sin.to(tl.float32)).to(x.dtype)
            x = (a.to(tl.float32) + b.to(tl.float32)).to(x.dtype)
        # Through the strides (paged_attention.cache_geometry), not a dense formula.
        row_offs = (token // BLOCK_SIZE) * stride_cb + (token % BLOCK_SIZE) * stride_co + dims
        if head < NUM_HEADS:
            tl.store(q_ptr + (row * NUM_HEADS + head) * HEAD_DIM + dims, x)
        elif head < NUM_HEADS + NUM_KV:
            tl.store(k_cache_ptr + row_offs + (head - NUM_HEADS) * stride_ch, x)
        else:
            tl.store(v_cache_ptr + row_offs + (head - NUM_HEADS - NUM_KV) * stride_ch, x)


def rope_and_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    """RoPE on Q and K of ``qkv [rows, heads + 2 * kv_heads, d]`` at ``positions``; K and V
    written to flat token row ``slot_mapping[row]`` (int64: ``block * block_size + offset``)
    of the paged caches ``[kv_heads, num_blocks + 1, block_size, d]``; returns Q
    ``[rows, heads, d]``. One kernel where the torch path takes six (rotate, scale, add,
    two cache scatters)."""
    assert triton is not None
    assert k_cache.stride() == v_cache.stride()
    block_size, _, stride_block, stride_offset, stride_head = cache_geometry(k_cache)
    rows, total, d = qkv.shape
    num_kv = (total - num_heads) // 2
    q = torch.empty((rows, num_heads, d), device=qkv.device, dtype=qkv.dtype)
    _rope_cache_kernel[(rows, total)](
        qkv,
        cos,
        signed_sin,
        q,
        k_cache,
        v_cache,
        slot_mapping,
        positions,
        stride_block,
        stride_offset,
        stride_head,
        NUM_HEADS=num_heads,
        NUM_KV=num_kv,
        HEAD_DIM=d,
        BLOCK_SIZE=block_size,
    )
    return q


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [rows, hidden]`` (contiguous) normalised and scaled, in ``x``'s dtype."""
    assert triton is not None
    rows, hidden = x.shape
    out = torch.empty_like(x)
    _rms_norm_kernel[(rows,)](x, weight, out, hidden, eps, BLOCK=triton.next_power_of_2(hidden))
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [rows, 2 * ffn]`` (gate first, as the fused GEMM)."""
    assert triton is not None
    rows, width = gate_up.shape
    ffn = width // 2
    out = torch.empty((rows, ffn), device=gate_up.device, dtype=gate_up.dtype)
    _silu_mul_kernel[(rows, triton.cdiv(ffn, SILU_BLOCK))](gate_up, out, ffn, BLOCK=SILU_BLOCK)
    return out
