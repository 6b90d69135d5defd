"""The runner's KV cache for a Llama network (docs/design.md#kv-blocks, #model).

The network (``llama.LlamaModel``) is layers: each pass reads and writes the paged KV
tensors it is handed. ``CacheEngine`` is what the runner owns around them:

- the block count (``kv_sizing``): exact, a byte budget, or on CUDA a share of the GPU
  less the weights and the activation peak of a ``max_seq_len`` prefill of the network
  on a throwaway cache; the same count on every tensor-parallel rank;
- the cache itself (``kv_cache.KVCache``), this rank's KV heads, in the network's dtype;
- on CUDA, the network's ``decode_step`` over that cache replayed from CUDA graphs
  (``decode_graphs``: static block-table buffers per batch bucket), which the runner
  runs instead of the network's torch ``decode``;
- the P/D port: the wire layout and whole blocks' bytes out and in (docs/pd.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial

from genpool_worker.kv_layout import KVLayout

from . import cpu_attention
from .checks import DecodeCheck
from .decode_graphs import GraphedDecode, Tables
from .kv_cache import KVCache
from .kv_sizing import KVSizing, bytes_per_block, cuda_free_for_kv, smallest_on_every_rank
from .llama import LlamaModel


class CacheEngine:
    """A network's paged KV cache, sized, allocated and captured for the runner."""

    def __init__(
        self,
        model: LlamaModel,
        sizing: KVSizing,
        *,
        max_decode_batch: int | None = None,
        cuda_graphs: bool | None = None,
        in_place_decode: bool | None = None,
    ) -> None:
        """``sizing``: where the block count comes from (at most one of an exact count,
        ``kv_cache_memory`` bytes, or on CUDA ``gpu_memory_utilization`` of the GPU, 0.9
        by default). ``max_decode_batch``: the most rows a decode gets (CUDA graphs are
        captured up to it); None = one per block. ``cuda_graphs``: replay decode steps
        from CUDA graphs; None = on CUDA at tp_size 1. ``in_place_decode``: the CPU
        decode reads blocks in place (``cpu_attention``); None = where it runs."""
        self.block_size = sizing.block_size
        self.num_blocks = _block_count(model, sizing)
        self.cache = _allocate(model, self.num_blocks, self.block_size, in_place_decode)
        if self.cache.decodes_in_place:
            cpu_attention.warm_up()
        self._layout = _wire_layout(model, self.block_size)
        self.decode_graphs = _graphed_decode(
            model, self.cache, cuda_graphs, max_decode_batch or self.num_blocks
        )

    @property
    def dummy_block(self) -> int:
        return self.num_blocks

    def kv_layout(self) -> KVLayout | None:
        """The cache's wire layout; None with tensor parallelism (each rank holds a shard of
        the heads and P/D moves one rank's KV: docs/pd.md)."""
        return self._layout

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        return self.cache.read_blocks(blocks)

    def write_kv(self, blocks: Sequence[int], data: bytearray) -> None:
        self.cache.write_blocks(blocks, data)

    def capture_decode_graphs(self) -> None:
        """Capture every decode batch bucket's CUDA graph now (else on first use)."""
        if self.decode_graphs is not None:
            self.decode_graphs.capture_all()

    @property
    def uses_cuda_graphs(self) -> bool:
        return self.decode_graphs is not None and self.decode_graphs.uses_graphs


def _allocate(
    model: LlamaModel, num_blocks: int, block_size: int, in_place_decode: bool | None = None
) -> KVCache:
    return KVCache(
        model.config,
        num_blocks=num_blocks,
        block_size=block_size,
        device=model.device,
        dtype=model.dtype,
        kv_heads=model.kv_heads,
        in_place_decode=in_place_decode,
    )


def _block_count(model: LlamaModel, sizing: KVSizing) -> int:
    """The block count (docs/design.md#kv-blocks), the same on every rank."""
    block_bytes = bytes_per_block(model.config, sizing.block_size, model.kv_heads, model.dtype)
    measure = partial(_free_for_kv, model, sizing.block_size)
    count = sizing.resolve(block_bytes, model.max_seq_len, model.device, measure)
    return smallest_on_every_rank(count, model.device, model.tp_size)


def _free_for_kv(model: LlamaModel, block_size: int, share: float) -> int:
    """CUDA bytes for the KV cache in ``share`` of the GPU, after a ``max_seq_len``
    prefill on a throwaway one-request cache has shown the activation peak."""
    blocks = list(range(-(-model.max_seq_len // block_size)))

    def profile() -> None:  # the cache and the logits are freed when it returns
        cache = _allocate(model, len(blocks), block_size)
        model.prefill(cache, blocks, [0] * model.max_seq_len)

    return cuda_free_for_kv(model.device, share, profile)


def _wire_layout(model: LlamaModel, block_size: int) -> KVLayout | None:
    if model.tp_size != 1:
        return None
    return KVLayout(
        model=model.name,
        dtype=str(model.dtype).removeprefix("torch."),
        block_size=block_size,
        num_layers=model.config.num_layers,
        num_kv_heads=model.kv_heads,
        head_dim=model.config.head_dim,
    )


def _graphed_decode(
    model: LlamaModel, cache: KVCache, cuda_graphs: bool | None, max_batch: int
) -> GraphedDecode | None:
    """CUDA: the network's paged Triton decode step over ``cache``, replayed from CUDA
    graphs (or, with graphs off, run eagerly from the same table buffers); else None."""
    if not model.fused_kernels:
        return None
    geometry = (cache.num_blocks, cache.block_size, model.max_seq_len)
    check_decode = DecodeCheck()  # walks only the block tables that changed

    def check(tables: Tables, tokens: list[int], positions: list[int]) -> None:
        check_decode(tables, tokens, positions, geometry, model.vocab_size)

    return GraphedDecode(
        partial(model.decode_step, cache),
        max_batch=max_batch,
        max_blocks_per_seq=-(-model.max_seq_len // cache.block_size),
        dummy_block=cache.dummy_block,
        device=model.device,
        graphs=model.tp_size == 1 if cuda_graphs is None else cuda_graphs,
        check=check,
    )
