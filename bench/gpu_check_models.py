"""gpu_check's models and correctness check: one random Llama, in transformers and ours.

Random weights at a Llama-3.1-8B shape (or ``TINY``): transformers builds the model,
ours is built from the same tensors, its config read back through our ``config.json``
reader. ``correctness`` compares the two along transformers' greedy sequence.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.decode_support import Ours, hf_generate
from genpool_core.kv_blocks import BlockPool, KVBudget
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE
from genpool_worker.model import CacheEngine, KVSizing, LlamaModel
from genpool_worker.model.hf_config import read_hf_config
from genpool_worker.model.hf_weights import gguf_name

LLAMA31_8B: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
TINY: dict[str, Any] = {
    **LLAMA31_8B,
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SEED = 20261130
NUM_PROMPTS = 4  # correctness: 4 x 64 teacher-forced positions


def build_models(
    shape: dict[str, Any], device: torch.device, dtype: torch.dtype, max_batch: int, max_len: int
) -> tuple[Any, Ours]:
    """transformers' model and ours, with KV blocks for ``max_batch`` requests of
    ``max_len`` tokens (decode graphs captured up to ``max_batch`` rows)."""
    import transformers

    config = transformers.LlamaConfig(**shape, architectures=["LlamaForCausalLM"])
    torch.manual_seed(SEED)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf: Any = transformers.LlamaForCausalLM(config)
            hf.eval()
    finally:
        torch.set_default_dtype(before)
    with tempfile.TemporaryDirectory() as tmp:
        hf.config.save_pretrained(tmp)
        (Path(tmp) / "config.json").write_text(
            json.dumps({**json.loads((Path(tmp) / "config.json").read_text()), "dtype": None})
        )
        ours_config, _ = read_hf_config(Path(tmp))
    weights = {}
    for name, tensor in hf.state_dict().items():
        ours_name = gguf_name(name)
        if ours_name is not None:
            weights[ours_name] = tensor
    model = LlamaModel(
        ours_config,
        weights,
        max_seq_len=max_len,
        device=device,
        dtype=dtype,
        name="llama-3.1-8b-shape-random",
        consume_weights=True,
    )
    sizing = KVSizing(DEFAULT_KV_BLOCK_SIZE, max_batch * -(-max_len // DEFAULT_KV_BLOCK_SIZE))
    return hf, Ours.of(model, CacheEngine(model, sizing, max_decode_batch=max_batch))


def block_tables(ours: Ours, rows: int, tokens: int) -> list[list[int]]:
    """``rows`` requests' blocks for ``tokens`` tokens each, as the scheduler hands them
    out (lowest free ids first: each request's blocks consecutive)."""
    pool = BlockPool(KVBudget(ours.kv.num_blocks, ours.kv.block_size))
    return [list(pool.allocate(pool.budget.blocks_for(tokens))) for _ in range(rows)]


def hf_generate_static(hf: Any, prompts: torch.Tensor, new: int, compiled: bool) -> Any:
    """transformers' greedy tokens with the static cache, eager or compiled."""
    return hf_generate(
        hf, prompts, new, cache_implementation="static", disable_compile=not compiled
    )


def correctness(hf: Any, ours: Ours, steps: int, prompt_len: int) -> dict[str, Any]:
    """Top-1 agreement along transformers' greedy sequence, ours and transformers' own
    bf16 each against a float32 copy of the same weights (the bf16 rounding noise of a
    random 32-layer model is the yardstick: ours should be as close as transformers)."""
    import copy

    g = torch.Generator().manual_seed(SEED)
    prompts = torch.randint(10, ours.model.vocab_size, (NUM_PROMPTS, prompt_len), generator=g)
    prompts = prompts.to(ours.model.device)
    hf_tokens = hf_generate_static(hf, prompts, steps, compiled=False)
    sequences = torch.cat([prompts, hf_tokens[:, :-1]], dim=1)
    with torch.inference_mode():
        hf_logits = hf(sequences).logits[:, prompt_len - 1 :].float()
        reference = copy.deepcopy(hf).float()
        ref_logits = reference(sequences).logits[:, prompt_len - 1 :].float()
        del reference
    tables = block_tables(ours, NUM_PROMPTS, prompt_len + steps)
    ids = prompts.tolist()
    run = ours.runner
    forced_steps = [torch.stack([run.prefill(t, i) for t, i in zip(tables, ids, strict=True)])]
    for i in range(steps - 1):  # teacher-forced, batched: feed transformers' token i
        forced_steps.append(
            run.decode(tables, hf_tokens[:, i].tolist(), [prompt_len + i] * NUM_PROMPTS)
        )
    forced = torch.stack(forced_steps, dim=1).float()
    free = [int(run.prefill(tables[0], ids[0]).argmax())]
    for i in range(steps - 1):
        free.append(int(run.decode(tables[:1], [free[-1]], [prompt_len + i])[0].argmax()))
    first = hf_tokens[0].tolist()
    prefix = next((i for i, (a, b) in enumerate(zip(free, first, strict=True)) if a != b), steps)
    ref_top1 = ref_logits.argmax(-1)

    def agree(logits: torch.Tensor, target: torch.Tensor) -> float:
        return float((logits.argmax(-1) == target).float().mean())

    return {
        "steps": steps,
        "prompts": NUM_PROMPTS,
        "prompt_len": prompt_len,
        "teacher_forced_top1_agreement": agree(forced, hf_logits.argmax(-1)),
        "ours_bf16_vs_fp32_top1": agree(forced, ref_top1),
        "hf_bf16_vs_fp32_top1": agree(hf_logits, ref_top1),
        "ours_vs_hf_max_abs_logit_diff": float((forced - hf_logits).abs().max()),
        "ours_vs_fp32_max_abs_logit_diff": float((forced - ref_logits).abs().max()),
        "hf_vs_fp32_max_abs_logit_diff": float((hf_logits - ref_logits).abs().max()),
        "logit_std": float(ref_logits.std()),
        "free_running_agreement": sum(a == b for a, b in zip(free, first, strict=True)) / steps,
        "free_running_identical_prefix": prefix,
    }
