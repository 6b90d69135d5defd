"""The serving check's model: a Hugging Face checkpoint directory with random weights,
written on the fly (nothing downloaded), that ``genpool-worker --model DIR`` loads as it
would a real one.

``config.json`` of the shape (``gpu_check_models.LLAMA31_8B`` or ``TINY``), bf16
safetensors shards (one per layer, plus the embedding, final norm and LM head, and the
index), drawn on the given device (normal, std 0.02; norms 1), and a word-level
tokenizer over the whole vocabulary: token ``i`` is the word ``w<i>`` (the ids of BOS,
EOS and 0 are specials), so a streamed chunk's token count is its word count. At
Llama-3.1-8B shape the shards are 16 GB: ``scratch_dir`` puts them in ``/dev/shm``
when it has room (RAM: written and read back at memory speed), else in the temp dir.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

STD = 0.02
BF16_BYTES = 2


def param_count(shape: dict[str, Any]) -> int:
    h, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    d = h // shape["num_attention_heads"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    per_layer = 2 * h + h * (q + 2 * kv) + q * h + 3 * h * f
    return int(shape["num_hidden_layers"] * per_layer + 2 * v * h + h)


def scratch_dir(shape: dict[str, Any]) -> str | None:
    """``/dev/shm`` when it holds the shards 1.5 times over, else None (the temp dir)."""
    shm = Path("/dev/shm")
    need = 1.5 * BF16_BYTES * param_count(shape)
    return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > need else None


def _shards(
    shape: dict[str, Any], device: torch.device, seed: int
) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """(file name, HF tensors) of each shard, drawn one shard at a time."""
    h, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    d = h // shape["num_attention_heads"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=g, device=device, dtype=torch.bfloat16).mul_(STD)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, device=device, dtype=torch.bfloat16)

    yield (
        "model-head.safetensors",
        {
            "model.embed_tokens.weight": rand(v, h),
            "model.norm.weight": ones(h),
            "lm_head.weight": rand(v, h),
        },
    )
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield (
            f"model-layer{i:03d}.safetensors",
            {
                p + "input_layernorm.weight": ones(h),
                p + "post_attention_layernorm.weight": ones(h),
                p + "self_attn.q_proj.weight": rand(q, h),
                p + "self_attn.k_proj.weight": rand(kv, h),
                p + "self_attn.v_proj.weight": rand(kv, h),
                p + "self_attn.o_proj.weight": rand(h, q),
                p + "mlp.gate_proj.weight": rand(f, h),
                p + "mlp.up_proj.weight": rand(f, h),
                p + "mlp.down_proj.weight": rand(h, f),
            },
        )


def write_tokenizer(directory: Path, shape: dict[str, Any]) -> None:
    """Word-level: token ``i`` is ``w<i>``; ids 0, BOS and EOS are ``<unk>`` and specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bos, eos = shape["bos_token_id"], shape["eos_token_id"]
    names = {0: "<unk>", bos: "<|begin_of_text|>", eos: "<|end_of_text|>"}
    vocab = {names.get(i, f"w{i}"): i for i in range(shape["vocab_size"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, bos_token=names[bos], eos_token=names[eos], unk_token="<unk>"
    )
    tokenizer.save_pretrained(directory)


def write_checkpoint(
    directory: Path, shape: dict[str, Any], device: torch.device, seed: int
) -> dict[str, Any]:
    """The checkpoint of ``shape`` in ``directory``: config, shards and index, tokenizer."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = {**shape, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_act": "silu", "torch_dtype": "bfloat16"}  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    weight_map: dict[str, str] = {}
    for name, tensors in _shards(shape, device, seed):
        save_file({k: t.cpu() for k, t in tensors.items()}, directory / name, {"format": "pt"})
        weight_map |= dict.fromkeys(tensors, name)
    index = {"metadata": {"total_size": BF16_BYTES * param_count(shape)}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    write_tokenizer(directory, shape)
    return {
        "directory": str(directory),
        "layers": shape["num_hidden_layers"],
        "parameters": param_count(shape),
        "bytes": BF16_BYTES * param_count(shape),
    }


def prompt_range(shape: dict[str, Any]) -> tuple[int, int]:
    """Prompt token ids to draw from: past the low ids, below the specials when they are
    at the vocabulary's top (Llama 3: 128000 and up)."""
    top = min(t for t in (shape["bos_token_id"], shape["eos_token_id"], shape["vocab_size"])
              if t > 10)  # fmt: skip
    return 10, top
