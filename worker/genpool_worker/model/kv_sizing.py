"""How many KV blocks a worker gets (docs/design.md#kv-blocks): an exact count, a byte
budget (``--kv-cache-memory``, any device), or on CUDA a share of the GPU
(``--gpu-memory-utilization``): what is left of it after the weights, everything else
already resident, and the activation peak of a ``max_seq_len`` prefill, as other engines
measure it. A budget that cannot hold one request of ``max_seq_len`` is refused, naming
the flag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from genpool_core.model_catalogue import kv_bytes_per_token
from genpool_core.names import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_KV_BLOCK_SIZE

from .config import LlamaConfig


def bytes_per_block(config: LlamaConfig, block_size: int, kv_heads: int, dtype: torch.dtype) -> int:
    """K and V of one block over every layer, for this rank's ``kv_heads``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return block_size * kv_bytes_per_token(config.num_layers, kv_heads, config.head_dim, itemsize)


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
            count = self.kv_cache_memory // block_bytes - 1  # the dummy block is in it
            source = f"--kv-cache-memory={self.kv_cache_memory} bytes"
        elif device.type == "cuda":
            share = self.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
            free = measure_free(share)
            count = max(0, free) // block_bytes - 1
            source = f"--gpu-memory-utilization={share:g} ({max(0, free)} bytes left for KV)"
        else:
            raise ValueError("the KV cache needs num_blocks or --kv-cache-memory off CUDA")
        count = max(0, count)
        if count < need:
            raise ValueError(
                f"{source} holds {count} KV blocks of {self.block_size} tokens "
                f"({block_bytes} bytes each); one request of --max-seq-len={max_seq_len} "
                f"needs {need} ({need * block_bytes} bytes): raise the budget or lower "
                "--max-seq-len"
            )
        return count


def cuda_free_for_kv(device: torch.device, share: float, profile: Callable[[], None]) -> int:
    """Bytes left for the KV cache in ``share`` of the GPU: ``share`` of its memory, less
    what is in use now (weights, CUDA context, other processes) and the allocation peak of
    ``profile`` (a prefill on a throwaway cache, freed when it returns)."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    profile()
    torch.cuda.synchronize(device)
    activation_peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    return int(share * total) - (total - free) - activation_peak


def smallest_on_every_rank(count: int, device: torch.device, tp_size: int) -> int:
    """Under tensor parallelism every rank takes the smallest count: their schedulers must
    hand out the same blocks."""
    if tp_size == 1:
        return count
    shared = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(shared, op=dist.ReduceOp.MIN)
    return int(shared.item())
