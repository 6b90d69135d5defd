"""Known models' shapes, so a tensor-parallel size that cannot work is refused before any
pod starts, and the operator can size a CPU worker's KV cache from its memory limit (pure).

The worker shards by attention heads, KV heads and MLP columns, so the tensor-parallel
size must divide all three (``genpool_worker.model.layers.Shard.check`` is the rule at
load time). For a model named here the operator applies the same rule at reconcile;
any other model (a checkpoint directory it cannot read) passes, and the worker's own
check at start reaches the GenPool's status through its termination message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """KV-cache bytes of one token: K and V of every layer's KV heads (the one formula)."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    num_layers: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    # The published parameter count: the embedding once, the LM head too when untied.
    num_params: int
    # The LM head is the embedding matrix (SmolLM2); Llama 3.1 has its own.
    tied_embeddings: bool

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over every layer and KV head."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype_bytes)

    def can_shard(self, tensor_parallel_size: int) -> bool:
        return self._common_divisor() % tensor_parallel_size == 0

    def tensor_parallel_sizes(self) -> list[int]:
        """Every size that shards this model: the divisors of what all three share."""
        common = self._common_divisor()
        return [n for n in range(1, common + 1) if common % n == 0]

    def _common_divisor(self) -> int:
        return math.gcd(self.num_heads, self.num_kv_heads, self.ffn_size)


_SMOLLM2_135M = ModelShape(
    num_heads=9, num_kv_heads=3, ffn_size=1536, num_layers=30, head_dim=64, hidden_size=576,
    vocab_size=49152, num_params=134_515_008, tied_embeddings=True,
)  # fmt: skip
_LLAMA_31_8B = ModelShape(
    num_heads=32, num_kv_heads=8, ffn_size=14336, num_layers=32, head_dim=128,
    hidden_size=4096, vocab_size=128256, num_params=8_030_261_248, tied_embeddings=False,
)  # fmt: skip
_LLAMA_31_70B = ModelShape(
    num_heads=64, num_kv_heads=8, ffn_size=28672, num_layers=80, head_dim=128,
    hidden_size=8192, vocab_size=128256, num_params=70_553_706_496, tied_embeddings=False,
)  # fmt: skip

# Keys are lower-case model names, matched against the last component of spec.model
# (a checkpoint directory in a model volume is usually named after its model).
KNOWN_MODELS: dict[str, ModelShape] = {
    "smollm2-135m": _SMOLLM2_135M,
    "smollm2-135m-instruct": _SMOLLM2_135M,
    "llama-3.1-8b": _LLAMA_31_8B,
    "llama-3.1-8b-instruct": _LLAMA_31_8B,
    "llama-3.1-70b": _LLAMA_31_70B,
    "llama-3.1-70b-instruct": _LLAMA_31_70B,
}


def known_shape(model: str) -> ModelShape | None:
    """The shape of ``model`` (a name or a path ending in one), or None when unknown."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return KNOWN_MODELS.get(name)


def tensor_parallel_problem(model: str, tensor_parallel_size: int) -> str | None:
    """Why ``tensor_parallel_size`` ranks cannot shard ``model``, or None when they can
    (or when the model is unknown)."""
    shape = known_shape(model)
    if shape is None or shape.can_shard(tensor_parallel_size):
        return None
    sizes = ", ".join(map(str, shape.tensor_parallel_sizes()))
    return (
        f"spec.tensorParallelSize: {tensor_parallel_size} cannot shard {model} "
        f"({shape.num_heads} attention heads, {shape.num_kv_heads} KV heads, MLP width "
        f"{shape.ffn_size}): it must divide all three; sizes that work: {sizes}"
    )
