"""Decode attention over the paged KV cache on the CPU: one compiled loop, no gather.

The CUDA path reads each row's blocks in place with a Triton kernel
(``paged_attention``). The CPU's torch path could only gather every row's blocks into a
contiguous copy first and run two matmuls over it: on two threads that copy, written by
one core and read by the other, made a batch-1 decode step 2.5-3.5 % slower than the
pre-paging layout read as a view (docs/worker.md, decode speed). This kernel maps each
key through the row's block table inside the loop and reads it where it lies. It runs on
one core, so the cache uses it where that is the faster (``is_faster``: on one thread
at any batch, else up to ``MAX_THREADED_ROWS`` rows) and torch's gather elsewhere.

Compiled by numba (a wheel: no compiler in the image) to machine code once per process,
or loaded from numba's on-disk cache. It runs on the calling thread with the GIL released
and no thread pool of its own: a second OpenMP runtime beside torch's would fight it for
the same cores. Its float32 sums run key by key in one fixed order, so its output does not
depend on where the blocks are (bit-identical across layouts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

numba: Any
try:
    import numba
except ImportError:  # the worker's dependency; without it the torch path gathers
    numba = None


@dataclass(frozen=True)
class InPlaceRows:
    """What the kernel reads for a decode batch: each row's block table (int32
    ``[B, width]``, padded with the dummy block) and its length (int32 ``[B]``)."""

    tables: np.ndarray[Any, np.dtype[np.int32]]
    lengths: np.ndarray[Any, np.dtype[np.int32]]

    @classmethod
    def of(cls, block_tables: Sequence[Sequence[int]], lengths: Sequence[int],
           block_size: int, pad: int) -> InPlaceRows:  # fmt: skip
        width = -(-max(lengths) // block_size)
        tables = np.full((len(block_tables), width), pad, dtype=np.int32)
        for row, (table, length) in enumerate(zip(block_tables, lengths, strict=True)):
            used = -(-length // block_size)
            tables[row, :used] = table[:used]
        return cls(tables, np.asarray(lengths, dtype=np.int32))


# Measured in SmolLM2 decode steps (docs/worker.md, decode speed): on one thread the
# kernel beats torch's gather at every batch (1 to 16 rows); on two, torch spreads its
# gather and matmuls over both cores and ties the kernel at 8 rows and wins at 16.
MAX_THREADED_ROWS = 4  # the most rows the kernel takes while torch has other threads


def is_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """The kernel runs float32 caches in host memory, with numba installed."""
    return numba is not None and device.type == "cpu" and dtype == torch.float32


def is_faster(num_rows: int) -> bool:
    """Whether the kernel (one core) beats torch's gather (every thread) at this batch."""
    return num_rows <= MAX_THREADED_ROWS or torch.get_num_threads() == 1


def warm_up() -> None:
    """Compile the kernel (or load it from numba's cache) now, not in the first decode."""
    q = torch.zeros((1, 1, 1, 16))
    cache = torch.zeros((1, 2, 1, 16))
    rows = InPlaceRows(np.zeros((1, 1), np.int32), np.ones(1, np.int32))
    paged_decode_attention(q, cache, cache, rows, 1.0)


def _attend_row(q, k, v, table, length, scale, out, row, head):  # type: ignore[no-untyped-def]
    """Row ``row``'s query heads of KV head ``head`` over its keys ``0..length-1``:
    scores key by key through the table, a softmax per query head, then the values."""
    group, dim = q.shape[2], q.shape[3]
    block_size = k.shape[2]
    scores = np.empty((group, length), np.float32)
    for p in range(length):
        key = k[head, table[p // block_size], p % block_size]
        for g in range(group):
            query = q[row, head, g]
            dot = np.float32(0.0)
            for i in range(dim):
                dot += query[i] * key[i]
            scores[g, p] = dot * scale
    for g in range(group):
        top = scores[g, 0]
        for p in range(1, length):
            top = max(top, scores[g, p])
        total = np.float32(0.0)
        for p in range(length):
            scores[g, p] = np.exp(scores[g, p] - top)
            total += scores[g, p]
        scores[g, :length] *= np.float32(1.0) / total
    acc = np.zeros((group, dim), np.float32)
    for p in range(length):
        value = v[head, table[p // block_size], p % block_size]
        for g in range(group):
            weight = scores[g, p]
            for i in range(dim):
                acc[g, i] += weight * value[i]
    out[row, head] = acc


def _attend_rows(q, k, v, tables, lengths, scale, out):  # type: ignore[no-untyped-def]
    for row in range(q.shape[0]):
        for head in range(q.shape[1]):
            _attend(q, k, v, tables[row], lengths[row], scale, out, row, head)


def _jit(function: Any, **options: Any) -> Any:
    """``function`` compiled, cached on disk where numba finds a writable directory.
    fastmath lets the dot products vectorise (their sums reassociate in SIMD lanes)."""
    assert numba is not None
    try:
        return numba.njit(fastmath=True, nogil=True, cache=True, **options)(function)
    except RuntimeError:  # no writable cache directory: compiled in each process
        return numba.njit(fastmath=True, nogil=True, **options)(function)


# _attend_rows' compiled body resolves ``_attend`` when it is compiled (on first use).
_attend: Any = _jit(_attend_row, inline="always") if numba is not None else None
_KERNEL: Any = _jit(_attend_rows) if numba is not None else None


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: InPlaceRows,
    scale: float,
) -> torch.Tensor:
    """``softmax(q K^T * scale) V`` of each row over its first ``length`` keys, read in
    place: ``q [B, kv_heads, group, d]`` (the query heads sharing a KV head: GQA), caches
    ``[kv_heads, num_blocks + 1, block_size, d]``. Returns ``[B, kv_heads, group, d]``."""
    assert _KERNEL is not None
    out = torch.empty_like(q)
    _KERNEL(
        q.contiguous().numpy(),
        k_cache.numpy(),
        v_cache.numpy(),
        rows.tables,
        rows.lengths,
        np.float32(scale),
        out.numpy(),
    )
    return out
