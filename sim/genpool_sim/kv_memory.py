"""KV memory in the simulator: a model's KV bytes per token, and a gauge of the blocks the
simulated workers hold (docs/design.md#kv-blocks for the blocks themselves).

The simulator's workers reserve blocks through the core's ``KVAccount`` (a
``ClusterConfig.kv_blocks`` budget); this module only turns blocks into bytes for a
model shape and measures, per worker, how many blocks are held, how many by paused
residents, and whether a waiting head is held back by memory or by the request caps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genpool_core.kv_blocks import KVBudget
from genpool_core.model_catalogue import kv_bytes_per_token
from genpool_core.scheduler import GenScheduler

GB = 10**9  # decimal gigabytes, as GPU memory is quoted


@dataclass(frozen=True, slots=True)
class KVShape:
    """A decoder's KV cache per token: K and V of every layer's KV heads."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(
            self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes
        )

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * block_size

    def budget_for(self, kv_bytes: int, block_size: int) -> KVBudget:
        """The whole blocks ``kv_bytes`` of memory hold."""
        return KVBudget(kv_bytes // self.bytes_per_block(block_size), block_size)

    def gb(self, blocks: float, block_size: int) -> float:
        return blocks * self.bytes_per_block(block_size) / GB


# Llama-3.1-8B in bfloat16: 32 layers, 8 KV heads of 128 -> 2 * 32 * 8 * 128 * 2 B = 128 KiB
LLAMA_31_8B_BF16 = KVShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)
# One H200 serving it: what is left for KV (0.9 of the 141 GB is 126.9 GB; less 16.1 GB of
# bf16 weights, 110.8 GB; less activations and CUDA graphs)
H200_LLAMA_8B_KV_BYTES = 108 * GB
LLAMA_31_8B_MAX_SEQ_LEN = 8192  # the context a static cache reserves per resident


@dataclass
class KVGauge:
    """Time-weighted KV use of every worker over ``[start, end)`` simulated seconds.

    Each pass holds its state (blocks used and paused, what holds the waiting head back)
    for the pass's step time; a worker between passes is idle and holds nothing (an empty
    batch has no paused residents: idle positions resume them).
    """

    start: float = 0.0
    end: float = float("inf")
    busy_s: float = 0.0
    used_block_s: float = 0.0
    paused_block_s: float = 0.0
    paused_only_block_s: float = 0.0  # blocks nobody but paused requests holds
    resident_s: float = 0.0  # residents (running and paused) x seconds
    memory_bound_s: float = 0.0  # waiters, and the head's blocks do not fit
    caps_bound_s: float = 0.0  # waiters, the head's blocks fit, no batch position or slot
    paused_s: dict[int, float] = field(default_factory=dict)  # paused blocks -> seconds

    def observe(self, scheduler: GenScheduler, now: float, step_s: float) -> None:
        seconds = min(now + step_s, self.end) - max(now, self.start)
        if seconds <= 0:
            return
        paused = sum(len(request.blocks) for request in scheduler.pausing)
        self.busy_s += seconds
        self.used_block_s += scheduler.kv.num_used * seconds
        self.paused_block_s += paused * seconds
        only = (
            scheduler.kv.num_held_only_by(scheduler.pausing)
            if paused and scheduler.kv.is_caching
            else paused
        )
        self.paused_only_block_s += only * seconds
        self.resident_s += scheduler.num_residents * seconds
        self.paused_s[paused] = self.paused_s.get(paused, 0.0) + seconds
        if scheduler.num_waiting:
            if scheduler.kv.can_fit(scheduler.queue.peek()):
                self.caps_bound_s += seconds
            else:
                self.memory_bound_s += seconds

    def metrics(self, num_blocks: int, worker_s: float) -> dict[str, float]:
        """Per worker over ``worker_s`` seconds of serving workers (idle time included)."""
        if worker_s <= 0:
            return {}
        idle = max(0.0, worker_s - self.busy_s)
        return {
            "kv_used_share": self.used_block_s / worker_s / num_blocks,
            "kv_used_blocks_mean": self.used_block_s / worker_s,
            "kv_paused_blocks_mean": self.paused_block_s / worker_s,
            "kv_paused_share": self.paused_block_s / worker_s / num_blocks,
            "kv_paused_only_share": self.paused_only_block_s / worker_s / num_blocks,
            "residents_mean": self.resident_s / worker_s,
            # residents the blocks hold at the run's mean blocks per resident (shared
            # blocks count once): the memory's capacity in requests, whatever the load
            "kv_resident_capacity": num_blocks * self.resident_s / self.used_block_s
            if self.used_block_s
            else math.nan,
            "kv_paused_blocks_p99": _weighted_p99(self.paused_s, idle),
            # shares of worker time; min: float sums over passes may pass 1 by an ulp
            "kv_memory_bound": min(1.0, self.memory_bound_s / worker_s),
            "kv_caps_bound": min(1.0, self.caps_bound_s / worker_s),
        }


def _weighted_p99(seconds_at: dict[int, float], idle_s: float) -> float:
    """The 99th percentile over time of a gauge held ``seconds_at[value]`` s per value."""
    weights = dict(seconds_at)
    weights[0] = weights.get(0, 0.0) + idle_s
    total = sum(weights.values())
    if total <= 0:
        return math.nan
    running = 0.0
    for value in sorted(weights):
        running += weights[value]
        if running >= 0.99 * total:
            return float(value)
    return float(max(weights))
