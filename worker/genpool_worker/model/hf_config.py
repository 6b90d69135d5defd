"""Read a Hugging Face checkpoint's ``config.json`` into a ``LlamaConfig``.

Supported: ``LlamaForCausalLM`` (Llama 2/3, SmolLM2), ``MistralForCausalLM`` and
``Qwen2ForCausalLM``, with GQA, tied embeddings and RoPE scaling of type ``linear``
or ``llama3``. Anything else that would change the numbers (another activation, a
sliding window shorter than the served length, quantized weights, YaRN...) is
refused here, at start, with the key that caused it: never wrong output.

Both spellings of the RoPE keys are read: ``rope_theta`` / ``rope_scaling`` (the
checkpoints on the Hub) and ``rope_parameters`` (written by transformers >= 5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import LlamaConfig, ModelLoadError, RopeScaling, parse_eos_ids

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# Keys whose presence (with a non-trivial value) means a feature we do not implement.
_REFUSED_KEYS = ("quantization_config", "partial_rotary_factor")


def read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} not found") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return loaded


def _int(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ModelLoadError(f"config.json: {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"config.json: {key!r} must be an integer, got {value!r}")
    return value


def _rope(raw: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(base, scaling) from ``rope_parameters`` or the older ``rope_theta``/``rope_scaling``."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelLoadError(f"config.json: rope parameters must be an object, got {params!r}")
    base = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return base, None
    try:
        factor = float(params["factor"])
        if kind == "linear":
            return base, RopeScaling("linear", factor)
        if kind == "llama3":
            return base, RopeScaling(
                "llama3",
                factor,
                low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]),
                original_context_length=int(params["original_max_position_embeddings"]),
            )
    except KeyError as exc:
        raise ModelLoadError(f"config.json: rope scaling {kind!r} needs {exc}") from None
    raise ModelLoadError(
        f"config.json: rope scaling type {kind!r} is not supported (default, linear, llama3)"
    )


def _check_features(raw: dict[str, Any], arch: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"config.json: hidden_act={act!r} is not supported (silu only)")
    for key in _REFUSED_KEYS:
        if raw.get(key) not in (None, 1.0):
            raise ModelLoadError(f"config.json: {key} is not supported ({raw[key]!r})")
    if arch == "Qwen2ForCausalLM" and raw.get("use_sliding_window"):
        raise ModelLoadError("config.json: use_sliding_window=true is not supported")
    layer_types = raw.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ModelLoadError(f"config.json: layer_types other than full_attention: {layer_types}")


def sliding_window(raw: dict[str, Any], arch: str) -> int | None:
    """The attention window in force (Mistral v0.1: 4096), or None for full attention."""
    if arch == "Qwen2ForCausalLM" and not raw.get("use_sliding_window"):
        return None
    window = raw.get("sliding_window")
    return None if window is None else int(window)


def checkpoint_eos_ids(
    directory: Path, raw: dict[str, Any], tokenizer_eos: int | None = None
) -> tuple[int, ...]:
    """Every EOS id of an HF checkpoint, the primary first: the tokenizer's EOS (what a
    chat turn ends with), then ``generation_config.json``'s ``eos_token_id`` (an id or a
    list: Llama 3 Instruct lists ``<|eot_id|>`` there), then ``config.json``'s."""
    generation = directory / "generation_config.json"
    listed = read_json(generation).get("eos_token_id") if generation.is_file() else None
    ids = (
        *(() if tokenizer_eos is None else (tokenizer_eos,)),
        *parse_eos_ids(listed, "generation_config.json: 'eos_token_id'"),
        *parse_eos_ids(raw.get("eos_token_id"), "config.json: 'eos_token_id'"),
    )
    if not ids:
        raise ModelLoadError(
            f"{directory}: no EOS token id in the tokenizer, generation_config.json or config.json"
        )
    return tuple(dict.fromkeys(ids))


def hf_context(directory: Path) -> tuple[int, str]:
    """The most tokens a request may span, read from ``config.json`` alone (before any
    weight): ``max_position_embeddings``, or a shorter sliding window in force (this
    package serves full attention only), with the key it came from."""
    raw = read_json(directory / "config.json")
    context = (_int(raw, "max_position_embeddings"), "config.json max_position_embeddings")
    archs = raw.get("architectures") or []
    window = sliding_window(raw, str(archs[0])) if len(archs) == 1 else None
    if window is not None and window < context[0]:
        return window, "config.json sliding_window"
    return context


def read_hf_config(
    directory: Path, eos_token_id: int | None = None
) -> tuple[LlamaConfig, dict[str, Any]]:
    """The config of an HF checkpoint directory, and the raw ``config.json`` it came from.

    ``eos_token_id``: the tokenizer's EOS, the primary one; the EOS ids of
    ``generation_config.json`` and ``config.json`` end a generation too
    (``checkpoint_eos_ids``).
    """
    raw = read_json(directory / "config.json")
    archs = raw.get("architectures") or []
    arch = archs[0] if len(archs) == 1 else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{directory}: architecture {archs} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    _check_features(raw, arch)
    hidden, heads = _int(raw, "hidden_size"), _int(raw, "num_attention_heads")
    base, scaling = _rope(raw)
    eos = checkpoint_eos_ids(directory, raw, eos_token_id)
    bos = raw.get("bos_token_id")
    config = LlamaConfig(
        num_layers=_int(raw, "num_hidden_layers"),
        hidden_size=hidden,
        ffn_size=_int(raw, "intermediate_size"),
        num_heads=heads,
        num_kv_heads=_int(raw, "num_key_value_heads", heads),
        head_dim=_int(raw, "head_dim", hidden // heads) if raw.get("head_dim") else hidden // heads,
        rope_base=base,
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        vocab_size=_int(raw, "vocab_size"),
        context_length=_int(raw, "max_position_embeddings"),
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_id=eos[0],
        name=directory.resolve().name,
        rope_scaling=scaling,
        eos_token_ids=eos,
    )
    return config, raw


def tokenizer_eos_id(directory: Path) -> int | None:
    """The id of ``tokenizer_config.json``'s ``eos_token`` (Llama 3.1 Instruct:
    ``<|eot_id|>``, which ends a chat turn, where config.json lists three ids)."""
    config_path, vocab_path = directory / "tokenizer_config.json", directory / "tokenizer.json"
    if not (config_path.is_file() and vocab_path.is_file()):
        return None
    eos = read_json(config_path).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str):
        return None
    vocab = read_json(vocab_path)
    for token in vocab.get("added_tokens") or []:
        if token.get("content") == eos:
            return int(token["id"])
    found = (vocab.get("model") or {}).get("vocab", {}).get(eos)
    return found if isinstance(found, int) else None
