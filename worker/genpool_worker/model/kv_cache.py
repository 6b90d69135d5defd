"""The static slot KV cache: allocated once, one row block per resident slot + a dummy."""

from __future__ import annotations

import torch

from .config import LlamaConfig


class KVCache:
    """Per-layer K/V tensors ``[num_slots + 1, kv_heads, max_seq_len, head_dim]``."""

    def __init__(
        self,
        config: LlamaConfig,
        *,
        num_slots: int,
        max_seq_len: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_heads: int | None = None,
    ) -> None:
        """``kv_heads``: this rank's KV heads under tensor parallelism (default: all)."""
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        heads = config.num_kv_heads if kv_heads is None else kv_heads
        shape = (num_slots + 1, heads, max_seq_len, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]

    @property
    def dummy_slot(self) -> int:
        return self.num_slots

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
