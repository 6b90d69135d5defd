"""The ``*.safetensors`` weights of an HF checkpoint, read lazily under our tensor names.

A checkpoint is one ``model.safetensors`` or shards listed by
``model.safetensors.index.json``. Tensors are renamed to the GGUF names the model
code uses (``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``) and
read from the memory-mapped file only when the model takes them, one at a time: a
rank holds at most one full tensor beside its shards, never the whole checkpoint
(a 70B's 140 GB on each of 8 ranks would not fit).

Every tensor's shape is checked from the file headers before anything is read, and
an unknown tensor is refused: it means a feature (Qwen3's QK norm, say) the model
would otherwise ignore.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch

from .config import LlamaConfig, ModelLoadError
from .hf_config import read_hf_config, read_json, sliding_window, tokenizer_eos_id

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# Buffers some older exports carry; recomputed by the model, so harmless to skip.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def gguf_name(hf_name: str) -> str | None:
    """Our name for an HF tensor; None for an ignored buffer; ModelLoadError if unknown."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    if hf_name.endswith(_IGNORED_SUFFIXES):
        return None
    parts = hf_name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        module, kind = ".".join(parts[3:-1]), parts[-1]
        if module in _LAYER_NAMES and kind in ("weight", "bias"):
            return f"blk.{parts[2]}.{_LAYER_NAMES[module]}.{kind}"
    raise ModelLoadError(f"tensor {hf_name!r} is not part of a supported Llama-family model")


def shard_files(directory: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file that holds it."""
    index = directory / INDEX_NAME
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: 'weight_map' is missing or empty")
        return {name: directory / str(file) for name, file in weight_map.items()}
    single = directory / SINGLE_NAME
    if not single.is_file():
        raise ModelLoadError(f"{directory}: neither {SINGLE_NAME} nor {INDEX_NAME} found")
    return {name: single for name in _open(single).keys()}  # noqa: SIM118 (not a dict)


def _open(path: Path) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # safetensors raises its own error types
        raise ModelLoadError(f"{path} is not a readable safetensors file: {exc}") from exc


class LazyWeights(MutableMapping[str, torch.Tensor]):
    """Our-name -> tensor, read from the safetensors file on access (``pop`` to consume)."""

    def __init__(self, directory: Path) -> None:
        self._handles: dict[Path, Any] = {}
        self._where: dict[str, tuple[Path, str]] = {}
        for hf_name, path in shard_files(directory).items():
            name = gguf_name(hf_name)
            if name is not None:
                self._where[name] = (path, hf_name)

    def _handle(self, path: Path) -> Any:
        if path not in self._handles:
            if not path.is_file():
                raise ModelLoadError(f"shard {path} listed in the index is missing")
            self._handles[path] = _open(path)
        return self._handles[path]

    def shape(self, name: str) -> tuple[int, ...]:
        path, hf_name = self._where[name]
        try:
            return tuple(self._handle(path).get_slice(hf_name).get_shape())
        except ModelLoadError:
            raise
        except Exception as exc:  # a tensor named by the index but absent from its shard
            raise ModelLoadError(f"{path}: cannot read tensor {hf_name}: {exc}") from exc

    def __getitem__(self, name: str) -> torch.Tensor:
        path, hf_name = self._where[name]
        tensor: torch.Tensor = self._handle(path).get_tensor(hf_name)
        return tensor

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        raise TypeError("checkpoint weights are read-only")

    def __delitem__(self, name: str) -> None:
        del self._where[name]
        if not self._where:
            self._handles.clear()  # every tensor consumed: unmap the files

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._where))

    def __len__(self) -> int:
        return len(self._where)


def expected_shapes(config: LlamaConfig, *, tied: bool) -> dict[str, tuple[int, ...]]:
    h, f, d = config.hidden_size, config.ffn_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (config.vocab_size, h),
        "output_norm.weight": (h,),
    }
    if not tied:
        shapes["output.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"blk.{i}."
        shapes |= {
            p + "attn_norm.weight": (h,),
            p + "attn_q.weight": (q, h),
            p + "attn_k.weight": (kv, h),
            p + "attn_v.weight": (kv, h),
            p + "attn_output.weight": (h, q),
            p + "ffn_norm.weight": (h,),
            p + "ffn_gate.weight": (f, h),
            p + "ffn_up.weight": (f, h),
            p + "ffn_down.weight": (h, f),
        }
    return shapes


def load_hf_weights(directory: Path, config: LlamaConfig, *, tied: bool) -> LazyWeights:
    """Lazy weights of ``directory``, every name and shape checked against ``config``.

    ``tied``: the LM head is the embedding (``tie_word_embeddings``); a stored
    ``lm_head.weight`` is then dropped, as transformers does.
    """
    weights = LazyWeights(directory)
    if tied and "output.weight" in weights:
        del weights["output.weight"]
    expected = expected_shapes(config, tied=tied)
    for name, shape in expected.items():
        if name not in weights:
            raise ModelLoadError(f"{directory}: tensor for {name} is missing")
        if weights.shape(name) != shape:
            raise ModelLoadError(
                f"{directory}: {name} has shape {weights.shape(name)}, expected {shape}"
            )
    for name in weights:
        if name in expected:
            continue
        weight_shape = expected.get(name.removesuffix(".bias") + ".weight")
        if weight_shape is None or len(weight_shape) != 2:
            raise ModelLoadError(f"{directory}: unexpected tensor {name}")
        if weights.shape(name) != weight_shape[:1]:  # a bias: one value per output row
            raise ModelLoadError(
                f"{directory}: {name} has shape {weights.shape(name)}, expected {weight_shape[:1]}"
            )
    return weights


def load_hf_checkpoint(directory: Path, max_seq_len: int) -> tuple[LlamaConfig, LazyWeights]:
    """Config and lazy weights of an HF checkpoint directory, refused if unsupported."""
    if not directory.is_dir():
        raise ModelLoadError(f"model directory {directory} not found")
    config, raw = read_hf_config(directory, eos_token_id=tokenizer_eos_id(directory))
    window = sliding_window(raw, str(raw["architectures"][0]))
    if window is not None and max_seq_len > window:
        raise ModelLoadError(
            f"{directory}: sliding_window={window} is not supported; serve it with "
            f"max_seq_len <= {window} (full attention is then identical)"
        )
    tied = bool(raw.get("tie_word_embeddings", False))
    return config, load_hf_weights(directory, config, tied=tied)
