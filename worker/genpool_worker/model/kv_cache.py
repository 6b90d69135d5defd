"""The paged KV cache (docs/design.md#kv-blocks): blocks of ``block_size`` tokens.

Per layer, K and V are ``[kv_heads, num_blocks + 1, block_size, head_dim]``: head-major,
so a token's flat row is ``block * block_size + offset`` in ``cache.view(kv_heads, -1,
head_dim)`` and one ``index_select`` of a batch's rows gives ``[kv_heads, rows, d]``
ready for the CPU path's matmuls (no second copy). Block ``num_blocks`` is the dummy
(padding) block, never a request's. Which blocks a request holds is the scheduler's
decision (``genpool_core.kv_blocks``), carried by the plan; this module only stores.

The number of blocks comes from memory (``KVSizing``): an exact count, a byte budget
(``--kv-cache-memory``), or on CUDA a share of the GPU (``--gpu-memory-utilization``:
what the measured weights and activation peak leave of it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from genpool_core.names import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_KV_BLOCK_SIZE

from .config import LlamaConfig


def bytes_per_block(config: LlamaConfig, block_size: int, kv_heads: int, dtype: torch.dtype) -> int:
    """K and V of one block over every layer, for this rank's ``kv_heads``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * kv_heads * config.head_dim * itemsize


@dataclass(frozen=True, slots=True)
class KVSizing:
    """Where the block count comes from: at most one of the three; none: on CUDA the
    default GPU share, elsewhere an error (the worker passes its default count)."""

    block_size: int = DEFAULT_KV_BLOCK_SIZE
    num_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None

    def __post_init__(self) -> None:
        given = [self.num_blocks, self.kv_cache_memory, self.gpu_memory_utilization]
        if sum(value is not None for value in given) > 1:
            raise ValueError("give num_blocks, kv_cache_memory or gpu_memory_utilization, one")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    def resolve(
        self,
        block_bytes: int,
        max_seq_len: int,
        device: torch.device,
        measure_free: Callable[[float], int],
    ) -> int:
        """The block count; ``measure_free(share)``: CUDA bytes left for the KV cache in
        ``share`` of the GPU (called only for a GPU share). Refuses a budget that cannot
        hold one request of ``max_seq_len``, naming the flag."""
        need = -(-max_seq_len // self.block_size)
        if self.num_blocks is not None:
            count, source = self.num_blocks, f"num_blocks={self.num_blocks}"
        elif self.kv_cache_memory is not None:
            count = self.kv_cache_memory // block_bytes
            source = f"--kv-cache-memory={self.kv_cache_memory} bytes"
        elif device.type == "cuda":
            share = self.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
            free = measure_free(share)
            count = max(0, free) // block_bytes
            source = f"--gpu-memory-utilization={share:g} ({max(0, free)} bytes left for KV)"
        else:
            raise ValueError("the KV cache needs num_blocks or --kv-cache-memory off CUDA")
        if count < need:
            raise ValueError(
                f"{source} holds {count} KV blocks of {self.block_size} tokens "
                f"({block_bytes} bytes each); one request of --max-seq-len={max_seq_len} "
                f"needs {need} ({need * block_bytes} bytes): raise the budget or lower "
                "--max-seq-len"
            )
        return count


class KVCache:
    """Per-layer paged K/V tensors ``[kv_heads, num_blocks + 1, block_size, head_dim]``."""

    def __init__(
        self,
        config: LlamaConfig,
        *,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_heads: int,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (kv_heads, num_blocks + 1, block_size, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]

    @property
    def dummy_block(self) -> int:
        return self.num_blocks

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def token_rows(self, blocks: Sequence[int], num_tokens: int) -> list[int]:
        """Flat rows of a request's positions ``0..num_tokens-1`` (its blocks in order)."""
        bs = self.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(num_tokens)]
