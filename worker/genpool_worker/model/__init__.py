"""Llama-family inference for the GEN worker: GGUF or HF checkpoints, tokenizer, the
network (``LlamaModel``) and the paged KV cache the runner owns for it (``CacheEngine``)."""

from . import cpu_attention
from .cache_engine import CacheEngine
from .config import LlamaConfig, ModelLoadError, RopeScaling
from .gguf_file import GGUFLoadError
from .gguf_weights import find_smollm2_gguf, load_gguf
from .hf_weights import load_hf_checkpoint
from .kv_cache import KVCache, PrefillSpan
from .kv_sizing import KVSizing
from .llama import LlamaModel
from .tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "CacheEngine",
    "GGUFLoadError",
    "KVCache",
    "KVSizing",
    "LlamaConfig",
    "LlamaModel",
    "ModelLoadError",
    "PrefillSpan",
    "RopeScaling",
    "Tokenizer",
    "cpu_attention",
    "find_smollm2_gguf",
    "load_gguf",
    "load_hf_checkpoint",
    "load_tokenizer",
]
