"""Host cost of a pass's sampling with one penalised request in the batch, against its
output's length: the worker's penalty counts, kept per request and updated per token
(``genpool_worker.model.sampler.PenaltyCounts``), beside what the worker did before
them, ``[rows, vocab]`` count tensors rebuilt every pass from every row's token lists.

Batch 64 at SmolLM2's vocabulary (49,152), prompts of 512 tokens, greedy rows, one of
them with repetition, presence and frequency penalties; its output so far is 256 or
2048 tokens. One pass: the penalised scores (both ways, checked equal), the token, and
the update for the next pass. CPU, the torch threads the worker uses on 2 cores.

    python -m bench.run penalties
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from bench.versus import versus_row, versus_table
from genpool_worker.model.sampler import SampleRow, _counts, _penalised
from genpool_worker.sampling_params import SamplingParams

__all__ = ["format_table", "pass_cost", "run"]  # bench.run's interface, and the GPU check's

VOCAB = 49_152
BATCH = 64
PROMPT = 512
OUTPUTS = (256, 2048)
PASSES = 50
PENALTIES = SamplingParams(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2)


def rebuilt_each_pass(scores: torch.Tensor, rows: Sequence[SampleRow],
                      outputs: Sequence[Sequence[int]]) -> torch.Tensor:  # fmt: skip
    """The worker before persistent counts: every row's counts from its lists, each pass."""
    vocab = scores.shape[-1]
    out_counts = _counts(outputs, vocab, scores.device)
    seen = (out_counts > 0) | (_counts([r.prompt_ids for r in rows], vocab, scores.device) > 0)

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, device=scores.device, dtype=scores.dtype)[:, None]

    repetition = column([r.params.repetition_penalty for r in rows])
    frequency = column([r.params.frequency_penalty for r in rows])
    presence = column([r.params.presence_penalty for r in rows])
    factor = torch.where(scores > 0, 1.0 / repetition, repetition)
    scores = torch.where(seen, scores * factor, scores)
    scores = scores - frequency * out_counts
    return scores - presence * (out_counts > 0).to(scores.dtype)


def _batch(output_len: int, seed: int) -> tuple[list[SampleRow], list[list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, VOCAB, (BATCH, PROMPT), generator=generator).tolist()
    output = torch.randint(0, VOCAB, (output_len,), generator=generator).tolist()
    rows = [SampleRow(PENALTIES if i == 0 else SamplingParams(), None, prompts[i], [])
            for i in range(BATCH)]  # fmt: skip
    rows[0].output_ids = list(output)
    outputs = [list(output)] + [[] for _ in range(BATCH - 1)]  # only penalised rows kept them
    return rows, outputs


def pass_cost(output_len: int, seed: int, device: str = "cpu") -> dict[str, float]:
    """Seconds a pass, both ways (kept, rebuilt), with the scores on ``device`` (the GPU
    check's too: bench/gpu_check_host.py); each way ends reading its token, a sync."""
    rows, outputs = _batch(output_len, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    spent = {"kept": 0.0, "rebuilt": 0.0}
    for _ in range(PASSES):
        scores = torch.randn(BATCH, VOCAB, generator=generator).to(device)
        start = time.perf_counter()
        kept = _penalised(scores, rows)
        token = int(kept[0].argmax())
        rows[0].took(token)
        middle = time.perf_counter()
        rebuilt = rebuilt_each_pass(scores, rows, outputs)
        token_again = int(rebuilt[0].argmax())
        outputs[0].append(token_again)
        spent["kept"] += middle - start
        spent["rebuilt"] += time.perf_counter() - middle
        if token != token_again or not torch.allclose(kept, rebuilt):
            raise AssertionError("kept counts and rebuilt counts disagree")
    return {name: seconds / PASSES for name, seconds in spent.items()}


def run(*, quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(2)
    lengths = (64,) if quick else OUTPUTS
    rows = []
    for length in lengths:
        best = {"kept": float("inf"), "rebuilt": float("inf")}
        for seed in range(1 if quick else 3):
            for name, seconds in pass_cost(length, seed).items():
                best[name] = min(best[name], seconds)
        rows.append(
            versus_row(
                ("output_tokens", length),
                ("kept_us_per_pass", best["kept"]),
                ("rebuilt_us_per_pass", best["rebuilt"]),
                1,
            )
        )
    return {
        "benchmark": "penalties",
        "description": "a pass's penalties, one penalised row of 64: counts kept vs rebuilt",
        "batch": BATCH, "vocab": VOCAB, "prompt_tokens": PROMPT, "passes": PASSES,
        "torch_threads": 2, "quick": quick, "rows": rows,
    }  # fmt: skip


def format_table(result: dict[str, Any]) -> str:
    return versus_table(result["rows"], ("output", "kept us", "rebuilt us", "ratio"))
