"""gpu_check's residents: how many requests one KV memory holds, paged vs static slots.

Arithmetic from the cache sizes, no GPU: a static slot cache reserves ``max_seq_len``
tokens per resident whatever its length; the paged cache reserves the blocks of its
prompt + output, block-rounded (``genpool_core.kv_blocks``: reserved whole at
admission). The Azure conversation trace's output length stands for ``max_tokens`` (a
client's cap is at least what it got, so real reservations are larger). Requests
longer than ``max_seq_len`` fit neither (a worker refuses them at that
``--max-seq-len``) and are left out of both counts; ``served_share`` says how many.

Two paged counts: ``mean`` (the memory over the mean reservation: residents in steady
state) and ``in_order`` (the most requests, from the trace's first, whose blocks fit
together: an admission snapshot with the trace's own mix of lengths). A grid of block
sizes and ``max_seq_len``s, which ``bench/kv_residents.py`` (one point, through the
scheduler's admission) does not sweep. Torch-free, so a unit test runs it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from genpool_core.kv_blocks import reserved_tokens
from genpool_sim.datafiles import AZURE_CONV, data_file
from genpool_sim.kv_memory import (
    GB,
    H200_LLAMA_8B_KV_BYTES,
    LLAMA_31_8B_BF16,
    LLAMA_31_8B_MAX_SEQ_LEN,
    KVShape,
)
from genpool_sim.workload import TraceRequest, parse_csv_trace

MAX_SEQ_LENS = (4096, LLAMA_31_8B_MAX_SEQ_LEN, 16384)  # 16384 covers the trace's longest
BLOCK_SIZES = (16, 32)


def residents_at(
    trace: Sequence[TraceRequest],
    *,
    kv_bytes: int,
    shape: KVShape,
    block_size: int,
    max_seq_len: int,
) -> dict[str, Any]:
    """Static and paged residents of ``kv_bytes`` for the requests of ``trace`` that fit
    ``max_seq_len``."""
    lengths = [reserved_tokens(r.prompt_tokens, r.output_tokens) for r in trace]
    served = [n for n in lengths if n <= max_seq_len]
    budget = shape.budget_for(kv_bytes, block_size)
    static = kv_bytes // (shape.bytes_per_token * max_seq_len)
    blocks = [budget.blocks_for(n) for n in served]
    mean_blocks = sum(blocks) / len(blocks)
    fits = itertools.takewhile(lambda used: used <= budget.num_blocks, itertools.accumulate(blocks))
    in_order = sum(1 for _ in fits)
    return {
        "block_size": block_size,
        "max_seq_len": max_seq_len,
        "served_share": len(served) / len(lengths),
        "mean_tokens": sum(served) / len(served),
        "mean_reserved_tokens": mean_blocks * block_size,
        "static_residents": static,
        "paged_residents_mean": int(budget.num_blocks / mean_blocks),
        "paged_residents_in_order": in_order,
        "ratio_mean": budget.num_blocks / mean_blocks / static if static else None,
        "ratio_in_order": in_order / static if static else None,
    }


def residents(
    trace: Sequence[TraceRequest],
    *,
    kv_bytes: int = H200_LLAMA_8B_KV_BYTES,
    shape: KVShape = LLAMA_31_8B_BF16,
    block_sizes: Sequence[int] = BLOCK_SIZES,
    max_seq_lens: Sequence[int] = MAX_SEQ_LENS,
) -> dict[str, Any]:
    """Every (block size, max_seq_len) pair of ``residents_at``, and what they assume."""
    return {
        "kv_gb": kv_bytes / GB,
        "kv_bytes_per_token": shape.bytes_per_token,
        "requests": len(trace),
        "rows": [
            residents_at(trace, kv_bytes=kv_bytes, shape=shape, block_size=bs, max_seq_len=m)
            for bs in block_sizes
            for m in max_seq_lens
        ],
    }


def azure_residents(path: Path | None = None, **options: Any) -> dict[str, Any]:
    """``residents`` of the Azure conversation trace (../shared/data, GENPOOL_DATA_DIR)."""
    path = data_file(AZURE_CONV) if path is None else path
    if not path.is_file():
        raise FileNotFoundError(f"the Azure trace is not at {path} (see GENPOOL_DATA_DIR)")
    with path.open(encoding="utf-8") as handle:
        trace = parse_csv_trace(handle, str(path))
    return {"trace": path.name, **residents(trace, **options)}
