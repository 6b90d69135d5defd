"""Decode steps on CUDA replayed from CUDA graphs, one graph per padded batch size.

A decode step at batch 1 of an 8B Llama is ~15 GB of weight reads (~3 ms of HBM
time on an H200) but ~600 kernel launches; launched from Python one by one they
take longer than the reads. A graph replays them all in one launch. Shapes must be
static: the batch is padded up to the next bucket with rows whose block table is all
the dummy block (position 0, which only ever writes the dummy block's offset 0), every
table row is padded to ``max_blocks_per_seq`` with the dummy block, and the attention
kernel reads each row's own length from a device tensor, so one graph serves every
context length.

Each bucket's block tables live in one static device buffer. A request's table is
fixed from admission to finish (its blocks are reserved whole, genpool_core.kv_blocks),
so from one step to the next at most a few rows change: the host copy is rewritten
only where a row differs and the buffer copied to the device only then. Building the
whole ``[bucket, max_blocks_per_seq]`` table every step would cost milliseconds of
Python at batch 128 (a row per 16 tokens of ``max_seq_len``), as much as the step.

Graphs are captured on a bucket's first use, largest-first sharing one memory pool.
Batches beyond the largest bucket, and tensor-parallel runs (NCCL inside captured
graphs is not exercised here), run the same step eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Tables = Sequence[Sequence[int]]
Check = Callable[[Tables, list[int], list[int]], None]


class BlockTables:
    """``rows`` block tables on the device, int32 ``[rows, width]``, dummy-padded."""

    def __init__(self, rows: int, width: int, dummy: int, device: torch.device) -> None:
        self.device_tables = torch.full((rows, width), dummy, dtype=torch.int32, device=device)
        # Pageable, not pinned: a copy from pageable memory has read it when copy_
        # returns, so the next step may rewrite it while the GPU is still busy.
        self._host = torch.full((rows, width), dummy, dtype=torch.int32)
        self._rows: list[tuple[int, ...]] = [()] * rows  # () is an all-dummy row
        self._width, self._dummy = width, dummy

    def update(self, tables: Tables) -> torch.Tensor:
        """Rows ``0..len(tables)-1`` set to ``tables``, the others to the dummy block."""
        if len(tables) > len(self._rows):
            raise ValueError(f"{len(tables)} block tables for {len(self._rows)} rows")
        changed = False
        for i, old in enumerate(self._rows):
            row = tuple(tables[i]) if i < len(tables) else ()
            if row != old:
                self._write(i, row)
                changed = True
        if changed:
            self.device_tables.copy_(self._host)
        return self.device_tables

    def clear(self) -> None:
        """Every row the dummy block (what a graph's warm-up may write into)."""
        self.update(())

    def _write(self, i: int, row: tuple[int, ...]) -> None:
        n = len(row)
        if n > self._width:
            raise ValueError(f"a block table of {n} blocks; at most {self._width} fit")
        if n:
            self._host[i, :n] = torch.tensor(row, dtype=torch.int32)
        self._host[i, n:] = self._dummy
        self._rows[i] = row


def dense_tables(tables: Tables, width: int, dummy: int) -> torch.Tensor:
    """int32 ``[len(tables), width]`` on the host, each row padded with ``dummy``."""
    flat: list[int] = []
    for row in tables:
        if len(row) > width:
            raise ValueError(f"a block table of {len(row)} blocks; at most {width} fit")
        flat.extend(row)
        flat.extend([dummy] * (width - len(row)))
    return torch.tensor(flat, dtype=torch.int32).view(len(tables), width)


class GraphedDecode:
    """Runs ``step(block_tables, tokens, positions) -> logits`` from device tensors:
    int32 ``[bucket, max_blocks_per_seq]``, int64 ``[bucket]`` and int64 ``[bucket]``.
    ``check`` refuses a bad batch (raising) before anything runs: a graph replay reads
    whatever block ids it is given."""

    def __init__(
        self,
        step: Step,
        *,
        max_batch: int,
        max_blocks_per_seq: int,
        dummy_block: int,
        device: torch.device,
        graphs: bool,
        check: Check | None = None,
    ) -> None:
        self._step = step
        self._check = check
        self._width = max_blocks_per_seq
        self._dummy = dummy_block
        self._device = device
        self._buckets = [b for b in BUCKETS if b < max_batch] + [
            next((b for b in BUCKETS if b >= max_batch), max_batch)
        ]
        self.uses_graphs = graphs
        self._tables: dict[int, BlockTables] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._inputs: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._pool: Any = None  # torch.cuda.graph_pool_handle()

    def _bucket(self, batch: int) -> int | None:
        return next((b for b in self._buckets if b >= batch), None)

    def _bucket_tables(self, bucket: int) -> BlockTables:
        if bucket not in self._tables:
            self._tables[bucket] = BlockTables(bucket, self._width, self._dummy, self._device)
        return self._tables[bucket]

    @torch.inference_mode()
    def run(self, block_tables: Tables, tokens: list[int], positions: list[int]) -> torch.Tensor:
        if self._check is not None:
            self._check(block_tables, tokens, positions)
        b = len(tokens)
        bucket = self._bucket(b)
        if bucket is None:  # beyond the largest bucket: one-off tensors, eager
            tables = dense_tables(block_tables, self._width, self._dummy).to(self._device)
            rows = torch.tensor([tokens, positions], dtype=torch.int64).to(self._device)
            return self._step(tables, rows[0], rows[1])
        if not self.uses_graphs:  # the bucket's table buffer, but no padding rows
            tables = self._bucket_tables(bucket).update(block_tables)[:b]
            rows = torch.tensor([tokens, positions], dtype=torch.int64).to(self._device)
            return self._step(tables, rows[0], rows[1])
        if bucket not in self._graphs:
            self._capture(bucket)
        self._bucket_tables(bucket).update(block_tables)
        pad = bucket - b
        host = torch.tensor([tokens + [0] * pad, positions + [0] * pad], dtype=torch.int64)
        self._inputs[bucket].copy_(host, non_blocking=True)
        self._graphs[bucket].replay()
        # A copy: the next replay overwrites the graph's output buffer.
        return self._outputs[bucket][:b].clone()

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every bucket now (largest first, so the smaller reuse its pool)."""
        if self.uses_graphs:
            for bucket in reversed(self._buckets):
                if bucket not in self._graphs:
                    self._capture(bucket)

    def drop_graphs(self) -> None:
        """Forget the captured graphs; the next run captures anew (a benchmark that swaps
        a kernel under the step needs its graphs recorded again)."""
        self._graphs.clear()
        self._inputs.clear()
        self._outputs.clear()

    def _capture(self, bucket: int) -> None:
        tables = self._bucket_tables(bucket)
        tables.clear()  # the warm-up below runs the step: on the dummy block only
        inputs = torch.zeros((2, bucket), dtype=torch.int64, device=self._device)
        args = (tables.device_tables, inputs[0], inputs[1])
        # Warm-up on a side stream (lazy cuBLAS / Triton initialisation must not be
        # captured); it writes the dummy block's offset 0 only.
        stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(*args)
        torch.cuda.current_stream(self._device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = self._step(*args)
        self._graphs[bucket], self._inputs[bucket], self._outputs[bucket] = graph, inputs, output
        log.debug("captured the decode graph for batch %d", bucket)
