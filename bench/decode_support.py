"""Decode timing shared by the model benchmarks (worker, cpu_decode, gpu_check).

Ours: prefill each request (untimed), then batched greedy ``decode`` steps, timed,
argmax and ``.tolist()`` included. transformers: ``generate`` greedy with
``min_new_tokens = max_new_tokens``, so exactly ``new`` tokens come back.
"""

from __future__ import annotations

import time
from typing import Any

import torch


def hf_generate(hf: Any, ids: torch.Tensor, new: int, pad_id: int = 0, **options: Any) -> Any:
    """transformers' greedy ``generate`` of exactly ``new`` tokens: the new tokens only."""
    with torch.inference_mode():
        out = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            **options,
            pad_token_id=pad_id,
        )
    return out[:, ids.shape[1] :]


def time_hf(
    hf: Any, prompts: list[list[int]], new: int, pad_id: int = 0
) -> tuple[float, list[list[int]]]:
    """Seconds of one ``hf_generate`` call on ``prompts`` (no padding), and its tokens."""
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    tokens = hf_generate(hf, ids, new, pad_id)
    seconds = time.perf_counter() - start
    return seconds, tokens.tolist()


def time_ours(
    model: Any, prompts: list[list[int]], slots: list[int], steps: int
) -> tuple[float, list[list[int]]]:
    """Prefill each prompt into its slot (untimed), then ``steps`` greedy decode steps:
    their seconds, and each request's tokens (the prefill's first one included)."""
    tokens = [int(model.prefill(s, p).argmax()) for s, p in zip(slots, prompts, strict=True)]
    positions = [len(p) for p in prompts]
    out = [[t] for t in tokens]
    start = time.perf_counter()
    for i in range(steps):
        tokens = model.decode(slots, tokens, [p + i for p in positions]).argmax(-1).tolist()
        for seq, t in zip(out, tokens, strict=True):
            seq.append(t)
    return time.perf_counter() - start, out
