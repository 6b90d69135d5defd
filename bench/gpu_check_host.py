"""The per-step host work of issue 36, item 2, on the device the GPU check runs on
(bench/gpu_check.py's last phase, under its time budget).

- Several prompts in one prefill forward against one forward each: ``bench.batched_prefill``'s
  comparison over the check's own model (Llama-3.1-8B shape in bf16 on a GPU) and its
  paged cache, prompts of 128 and 512 tokens.
- A pass's penalties with one penalised row of 64: the counts kept per request against
  count tensors rebuilt every pass, ``bench.penalties``' comparison with its scores on the
  device.

The block-table check (``bench.decode_check``) and incremental detokenization
(``bench.detokenize``) run on the host alone, whatever the device: their CPU results
stand for a GPU worker as they are.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

from bench import batched_prefill, penalties
from bench.decode_support import Ours

PREFILL_SHAPES = ((4, 128), (16, 128), (4, 512))  # (prompts, tokens each)
QUICK_PREFILL_SHAPES = ((2, 16),)
PENALISED_OUTPUTS = (256, 2048)
REPEATS = 3
SEED = 20261205

# bench.gpu_check.measure: (result, key, budget, need_s, fn), the budget and errors handled
Measure = Callable[[dict[str, Any], str, Any, float, Callable[[], Any]], Any]


def measure_host_work(measure: Measure, budget: Any, result: dict[str, Any], ours: Ours,
                      quick: bool) -> None:  # fmt: skip
    """Each comparison into ``result`` through the check's ``measure``."""
    rng = random.Random(SEED)
    shapes = QUICK_PREFILL_SHAPES if quick else PREFILL_SHAPES
    for k, n in shapes:
        row = partial(batched_prefill.compare, ours, k, n, 1 if quick else REPEATS, rng)
        measure(result, f"batched_prefill_k{k}_n{n}", budget, 10, row)
    device = str(ours.model.device)
    for length in (64,) if quick else PENALISED_OUTPUTS:
        cost = partial(penalties.pass_cost, length, 0, device)
        measure(result, f"penalties_out{length}", budget, 10, cost)
