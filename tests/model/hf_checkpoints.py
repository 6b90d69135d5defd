"""Tiny random-weight Hugging Face checkpoints of each supported architecture, made with
transformers itself (a config, ``save_pretrained`` to a directory; nothing downloaded).

Weights are redrawn at a larger scale than transformers' init (std 0.02 gives
near-uniform logits, where greedy argmax would compare float noise).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

VOCAB = 96
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
# name -> (transformers config class, extra config keys)
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    # Llama 3.1-style: GQA, llama3 rope scaling, untied head, biases on Q/K/V/O.
    "llama3": (
        "LlamaConfig",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            "attention_bias": True,
            "tie_word_embeddings": False,
        },
    ),
    # SmolLM2-style: tied embeddings, no biases.
    "smollm2": ("LlamaConfig", {"rope_theta": 100000.0, "tie_word_embeddings": True}),
    # Mistral: explicit head_dim (!= hidden / heads, as in Mistral-Nemo), no window.
    "mistral": (
        "MistralConfig",
        {"head_dim": 24, "sliding_window": None, "tie_word_embeddings": False},
    ),
    # Qwen2: Q/K/V biases, tied embeddings.
    "qwen2": ("Qwen2Config", {"rope_theta": 1000000.0, "tie_word_embeddings": True}),
}
# The greedy-equality schedule's prompts (tests/model/paged.py): seeded ids past the
# specials, lengths 4..13 (no multiple of the tests' block size 5), SCHEDULE_TOKENS each.
_g = torch.Generator().manual_seed(7)
PROMPTS = [torch.randint(5, VOCAB, (n,), generator=_g).tolist() for n in (7, 11, 4, 13, 9)]
SCHEDULE_TOKENS = 12
ARCH_CLASSES = {
    "LlamaConfig": "LlamaForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "Qwen2Config": "Qwen2ForCausalLM",
}


def hf_model(arch: str, seed: int = 0) -> Any:
    """A float32 transformers model of ``arch`` with seeded, large-ish random weights."""
    import transformers

    config_class, extra = ARCHS[arch]
    config = getattr(transformers, config_class)(**COMMON, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, ARCH_CLASSES[config_class])(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=g)
            param.copy_(1.0 + 0.1 * noise if "norm" in name else 0.15 * noise)
    return model


def transformers_greedy(hf: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' greedy ``generate`` of each prompt alone: up to ``new_tokens`` new
    tokens, or to EOS (included)."""
    refs = []
    with torch.inference_mode():
        for prompt in prompts:
            out = hf.generate(
                torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0
            )
            refs.append(out[0, len(prompt) :].tolist())
    return refs


def make_tokenizer() -> Any:
    """A word-level tokenizer over ``VOCAB`` tokens with a ChatML template and a BOS rule."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>", "<unk>"]
    words = [f"w{i}" for i in range(VOCAB - len(specials) - 3)] + ["user", "assistant", "\n"]
    vocab = {tok: i for i, tok in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=template,
    )


def make_checkpoint(
    directory: Path, arch: str, *, seed: int = 0, max_shard_size: str | None = None
) -> Any:
    """Write ``arch``'s checkpoint (+ tokenizer) to ``directory``; returns the HF model."""
    model = hf_model(arch, seed)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **kwargs)
    make_tokenizer().save_pretrained(directory)
    return model


def edit_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))
