"""SmolLM2 (Llama) inference for the GEN worker: GGUF weights, tokenizer, slot-KV model."""

from .gguf_weights import GGUFLoadError, LlamaConfig, find_smollm2_gguf, load_gguf
from .kv_cache import KVCache
from .llama import LlamaModel
from .tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "GGUFLoadError",
    "KVCache",
    "LlamaConfig",
    "LlamaModel",
    "Tokenizer",
    "find_smollm2_gguf",
    "load_gguf",
    "load_tokenizer",
]
