"""Residents one worker's KV memory admits: paged blocks vs a static cache (docs/results.md).

One worker's KV at the Llama-3.1-8B shape on one H200 (``genpool_sim.kv_memory``: 108 GB,
128 KiB per token, 51498 blocks of 16 tokens). Every count goes through the core itself:
a ``GenScheduler`` with that ``KVBudget`` and a batch too large to bind is fed requests
until the queue's head does not fit, and the residents of that one pass are counted.

- **paged**: requests with the Azure conversation trace's lengths; each reserves
  ``blocks_for(prompt + output)`` (``KVAccount``). In trace order, and over seeded
  draws of (prompt, output) pairs as the simulator's closed loop draws them.
- **static**: every resident reserves ``max_seq_len`` tokens (8192: the Llama-3.1-8B
  example's context), what a cache of one ``max_seq_len`` row per slot holds.

Requests longer than ``max_seq_len`` (prompt + output) are left out of both: a server
with that context refuses them. ``bench/gpu_check_residents.py`` does the same count by
arithmetic over a grid of block sizes and ``max_seq_len``s (what gpu_check records).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

from genpool_core.kv_blocks import KVBudget, reserved_tokens
from genpool_core.names import DEFAULT_KV_BLOCK_SIZE
from genpool_core.preemption import GenCapacity
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_sim.datafiles import AZURE_CONV, data_file
from genpool_sim.kv_memory import (
    GB,
    H200_LLAMA_8B_KV_BYTES,
    LLAMA_31_8B_BF16,
    LLAMA_31_8B_MAX_SEQ_LEN,
)
from genpool_sim.report import mean_ci
from genpool_sim.workload import LengthSampler, TraceRequest, parse_csv_trace

SHAPE, BLOCK, MAX_SEQ_LEN = LLAMA_31_8B_BF16, DEFAULT_KV_BLOCK_SIZE, LLAMA_31_8B_MAX_SEQ_LEN
BUDGET = SHAPE.budget_for(H200_LLAMA_8B_KV_BYTES, BLOCK)
TARGET_RATIO = 4.0
DRAWS = {True: 3, False: 20}  # quick -> seeded draws of the trace


def load_azure() -> list[TraceRequest]:
    path = data_file(AZURE_CONV)
    if not path.is_file():
        raise SystemExit(f"bench kv_residents needs the Azure trace at {path}")
    with path.open() as handle:
        return parse_csv_trace(handle, str(path))


def admit(lengths: Sequence[tuple[int, int]], budget: KVBudget) -> list[GenRequest]:
    """The residents one pass admits from ``lengths`` (queue order) under ``budget``."""
    scheduler = GenScheduler.from_settings(
        {},
        GenCapacity(max_batch_size=max(1, len(lengths))),  # the batch never binds
        SchedulerConfig(max_queue_length=max(1, len(lengths)), kv_budget=budget),
    )
    for i, (prompt, output) in enumerate(lengths):
        # num_output_tokens=0: the worker does its own prefill, as one H200 worker does
        request = GenRequest(f"r{i}", prompt, output, arrival_time=0.0, num_output_tokens=0)
        scheduler.add_request(request, 0.0)
    plan = scheduler.step(0.0)
    return [scheduler.get_request(request_id) for request_id in plan.admitted_ids]


def _past_full(lengths: Sequence[tuple[int, int]], budget: KVBudget) -> list[tuple[int, int]]:
    """The shortest prefix of ``lengths`` whose blocks overflow ``budget`` (all if none)."""
    total = 0
    for end, (prompt, output) in enumerate(lengths, start=1):
        total += budget.blocks_for(reserved_tokens(prompt, output))
        if total > budget.num_blocks:
            return list(lengths[:end])
    return list(lengths)


def static_residents(budget: KVBudget, max_seq_len: int) -> list[GenRequest]:
    """Residents that each reserve ``max_seq_len`` tokens (a prompt of 1, the rest output)."""
    count = budget.num_blocks // budget.blocks_for(max_seq_len) + 1
    return admit([(1, max_seq_len - 1)] * count, budget)


def _draw(pairs: list[tuple[int, int]], seed: int) -> dict[str, float]:
    """Residents of one seeded draw of the trace's (prompt, output) pairs."""
    sampler = LengthSampler([TraceRequest(0.0, p, o) for p, o in pairs], random.Random(seed))
    drawn: list[tuple[int, int]] = []
    total = 0
    while total <= BUDGET.num_blocks:  # until the last draw cannot fit
        drawn.append(sampler.sample())
        total += BUDGET.blocks_for(reserved_tokens(*drawn[-1]))
    residents = admit(drawn, BUDGET)
    blocks = [len(r.blocks) for r in residents]
    tokens = sum(reserved_tokens(r.prompt_len, r.max_tokens) for r in residents)
    return {
        "residents": float(len(residents)),
        "gb_per_resident": SHAPE.gb(statistics.fmean(blocks), BLOCK),
        "rounding_waste": 1.0 - tokens / (sum(blocks) * BLOCK),  # of the blocks held
    }


def _stat(values: list[float]) -> dict[str, float]:
    mean, ci = mean_ci(values)
    return {"mean": mean, "ci95": ci, "min": min(values), "max": max(values)}


def run(*, quick: bool) -> dict[str, Any]:
    trace = load_azure()
    served = [(r.prompt_tokens, r.output_tokens) for r in trace
              if reserved_tokens(r.prompt_tokens, r.output_tokens) <= MAX_SEQ_LEN]  # fmt: skip
    static = static_residents(BUDGET, MAX_SEQ_LEN)
    draws = [_draw(served, seed) for seed in range(DRAWS[quick])]
    ratio = _stat([d["residents"] / len(static) for d in draws])
    budget = {
        "kv_bytes": H200_LLAMA_8B_KV_BYTES,
        "bytes_per_token": SHAPE.bytes_per_token,
        "block_size": BLOCK,
        "num_blocks": BUDGET.num_blocks,
        "num_tokens": BUDGET.num_tokens,
    }
    return {
        "benchmark": "kv_residents",
        "quick": quick,
        "budget": budget,
        "trace": {
            "requests": len(trace),
            "left_out_over_max_seq_len": len(trace) - len(served),
            "max_seq_len": MAX_SEQ_LEN,
        },
        "static": {
            "residents": len(static),
            "gb_per_resident": SHAPE.gb(len(static[0].blocks), BLOCK),
        },
        "paged_draws": {key: _stat([d[key] for d in draws]) for key in draws[0]},
        "draws": len(draws),
        # the trace's first requests as they come (one admission snapshot of its mix)
        "paged_in_trace_order": len(admit(_past_full(served, BUDGET), BUDGET)),
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio["mean"] >= TARGET_RATIO,
    }


def format_table(result: dict[str, Any]) -> str:
    budget, static, paged = result["budget"], result["static"], result["paged_draws"]
    ratio, gb, residents = result["ratio"], paged["gb_per_resident"], paged["residents"]
    lines = [
        f"KV residents at an equal budget: {budget['num_blocks']} blocks of "
        f"{budget['block_size']} tokens ({budget['kv_bytes'] / GB:.0f} GB at "
        f"{budget['bytes_per_token'] // 1024} KiB/token), Azure conv lengths"
        + ("  [QUICK]" if result["quick"] else ""),
        f"  static (max_seq_len {result['trace']['max_seq_len']}): {static['residents']} "
        f"residents, {static['gb_per_resident']:.3f} GB each",
        f"  paged, {result['draws']} seeded draws: {residents['mean']:.1f} ± "
        f"{residents['ci95']:.1f} residents ({residents['min']:.0f}-{residents['max']:.0f}), "
        f"{gb['mean']:.3f} ± {gb['ci95']:.3f} GB each (what a paused one holds), block "
        f"rounding {100 * paged['rounding_waste']['mean']:.2f} % of the blocks",
        f"  ratio {ratio['mean']:.2f}x ± {ratio['ci95']:.2f} (target >= {TARGET_RATIO:.0f}x: "
        f"{'met' if result['meets_target'] else 'NOT met'}); "
        f"{result['trace']['left_out_over_max_seq_len']} of {result['trace']['requests']} "
        f"trace requests left out (> max_seq_len)",
        f"  paged, the trace's first requests in order: {result['paged_in_trace_order']}",
    ]
    return "\n".join(lines)
