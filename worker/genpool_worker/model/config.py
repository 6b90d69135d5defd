"""The architecture hyper-parameters of a Llama-family decoder, whatever file they came from.

Both loaders (GGUF and Hugging Face directories) produce a ``LlamaConfig``; the model
code reads nothing else, so a feature this package does not implement must be refused
by the loader, never silently dropped here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


class ModelLoadError(ValueError):
    """A checkpoint is missing, unreadable, or not a model this package can run."""


def parse_eos_ids(value: object, where: str) -> tuple[int, ...]:
    """The EOS ids one checkpoint key gives: a token id, a list of them, or none (the key
    missing, null, or an empty list). Anything else is refused, naming ``where``."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ModelLoadError(
                f"{where} must be a token id or a list of token ids, got {value!r}"
            )
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: ``linear`` (positions / factor) or Llama 3.1's ``llama3``."""

    kind: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context_length: int = 8192

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ModelLoadError(f"rope scaling factor must be > 0, got {self.factor}")
        if self.kind == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ModelLoadError(
                "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )


@dataclass(frozen=True)
class LlamaConfig:
    """Architecture hyper-parameters (GGUF ``llama.*`` keys or an HF ``config.json``).

    Attention / MLP biases are not flags here: a layer has a bias when its checkpoint
    holds one (Qwen2's Q/K/V, Llama's optional ``attention_bias``).

    ``eos_token_id`` is the primary EOS (the tokenizer's); ``eos_token_ids`` every id
    that ends a generation, the primary first (Llama 3 Instruct: ``<|eot_id|>`` and
    ``<|end_of_text|>``), filled in with the primary when not given.
    """

    num_layers: int
    hidden_size: int
    ffn_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    vocab_size: int
    context_length: int
    bos_token_id: int | None
    eos_token_id: int
    name: str = "llama"
    rope_scaling: RopeScaling | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        eos = tuple(dict.fromkeys((self.eos_token_id, *self.eos_token_ids)))
        outside = [token for token in eos if not 0 <= token < self.vocab_size]
        if outside:
            raise ModelLoadError(
                f"EOS token ids {outside} are outside the vocabulary (vocab_size={self.vocab_size})"
            )
        object.__setattr__(self, "eos_token_ids", eos)  # frozen: set once, here
        for field in ("num_layers", "hidden_size", "ffn_size", "num_heads", "num_kv_heads"):
            if getattr(self, field) < 1:
                raise ModelLoadError(f"{field} must be >= 1, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim < 2 or self.head_dim % 2:
            raise ModelLoadError(f"head_dim={self.head_dim} must be even for RoPE")
