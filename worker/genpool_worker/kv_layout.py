"""The KV cache's wire layout: the shape and order of a block's K and V bytes as the
cache reads and writes them (``read_kv`` / ``write_kv``), so whoever moves KV between
caches (P/D's pull, docs/pd.md#the-pull) can check two caches agree before one decodes
from the other's blocks. No torch here: the model fills it in."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# Bytes per element of each dtype the layout may name (torch's names, without "torch.").
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Per layer, K then V, each ``[num_kv_heads, num_blocks, block_size, head_dim]``."""

    model: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("block_size", "num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.tensor_parallel_size != 1:
            raise ValueError("P/D moves the KV of one rank: tensor_parallel_size must be 1")

    @property
    def bytes_per_block_tensor(self) -> int:
        """One layer's K (or V) of one block."""
        return self.num_kv_heads * self.block_size * self.head_dim * DTYPE_BYTES[self.dtype]

    def num_bytes(self, num_blocks: int) -> int:
        """What a pull of ``num_blocks`` blocks moves: every layer's K and V of them."""
        return 2 * self.num_layers * num_blocks * self.bytes_per_block_tensor

    def mismatch(self, other: KVLayout) -> str | None:
        """The first field in which ``other`` differs, else None."""
        for field in fields(self):
            if getattr(self, field.name) != getattr(other, field.name):
                return field.name
        return None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
