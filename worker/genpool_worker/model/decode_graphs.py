"""Decode steps on CUDA replayed from CUDA graphs, one graph per padded batch size.

A decode step at batch 1 of an 8B Llama is ~15 GB of weight reads (~3 ms of HBM
time on an H200) but ~600 kernel launches; launched from Python one by one they
take longer than the reads. A graph replays them all in one launch. Shapes must be
static: the batch is padded up to the next bucket with the dummy slot (position 0,
which only ever writes the dummy slot's row 0), and the attention kernel reads each
row's own length from a device tensor, so one graph serves every context length.

Graphs are captured on a bucket's first use, largest-first sharing one memory pool.
Batches beyond the largest bucket, and tensor-parallel runs (NCCL inside captured
graphs is not exercised here), run the same step eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class GraphedDecode:
    """Runs ``step(slots, tokens, positions) -> logits`` from int64 device tensors."""

    def __init__(
        self, step: Step, *, max_batch: int, dummy_slot: int, device: torch.device, graphs: bool
    ) -> None:
        self._step = step
        self._dummy = dummy_slot
        self._device = device
        self._buckets = [b for b in BUCKETS if b < max_batch] + [
            next((b for b in BUCKETS if b >= max_batch), max_batch)
        ]
        self.uses_graphs = graphs
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._inputs: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._pool: Any = None  # torch.cuda.graph_pool_handle()

    def _bucket(self, batch: int) -> int | None:
        return next((b for b in self._buckets if b >= batch), None)

    def run(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        b = len(slots)
        bucket = self._bucket(b) if self.uses_graphs else None
        if bucket is None:
            rows = torch.tensor([slots, tokens, positions], dtype=torch.int64)
            rows = rows.to(self._device, non_blocking=True)
            return self._step(rows[0], rows[1], rows[2])
        pad = bucket - b
        host = torch.tensor(
            [slots + [self._dummy] * pad, tokens + [0] * pad, positions + [0] * pad],
            dtype=torch.int64,
        )
        if bucket not in self._graphs:
            self._capture(bucket)
        self._inputs[bucket].copy_(host, non_blocking=True)
        self._graphs[bucket].replay()
        # A copy: the next replay overwrites the graph's output buffer.
        return self._outputs[bucket][:b].clone()

    def capture_all(self) -> None:
        """Capture every bucket now (largest first, so the smaller reuse its pool)."""
        if self.uses_graphs:
            for bucket in reversed(self._buckets):
                if bucket not in self._graphs:
                    self._capture(bucket)

    def _capture(self, bucket: int) -> None:
        inputs = torch.zeros((3, bucket), dtype=torch.int64, device=self._device)
        inputs[0] = self._dummy
        # Warm-up on a side stream (lazy cuBLAS / Triton initialisation must not be
        # captured); it writes the dummy slot's row 0 only.
        stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(inputs[0], inputs[1], inputs[2])
        torch.cuda.current_stream(self._device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = self._step(inputs[0], inputs[1], inputs[2])
        self._graphs[bucket], self._inputs[bucket], self._outputs[bucket] = graph, inputs, output
        log.debug("captured the decode graph for batch %d", bucket)
