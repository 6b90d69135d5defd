"""gpu_check's paged-KV measurements, against the pre-paging kernel kept in bench/.

- ``swapped_to_static``: our decode with the previous static-slot kernel
  (``bench/static_slot_attention.py``) in place of ``paged_attention`` and nothing else
  changed (same weights, fused ops, CUDA graphs, RoPE + KV write). Timing only: the
  static kernel reads its own caches, laid out as before the paging, so the logits
  are meaningless; ``gpu_check`` times the same steps with and without the swap.
- ``attention_sweep``: the two kernels alone at the model's attention shape, per
  (batch, context), from CUDA graphs of back-to-back calls; the paged one also at other
  split settings (to choose ``NUM_SPLITS``/``MIN_SPLIT``) and checked against the static
  one on the same keys (the static cache is the paged one gathered).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from bench.decode_support import Ours
from bench.static_slot_attention import slot_decode_attention
from genpool_worker.model import paged_attention

# (label, num_splits, min_split): the default first, then the settings it was chosen over
PAGED_SETTINGS = (
    ("paged", paged_attention.NUM_SPLITS, paged_attention.MIN_SPLIT),
    ("paged_s16_min32", 16, 32),
    ("paged_s32_min128", 32, 128),
)
ROTATE_BYTES = 256 * 2**20  # caches cycled per timing, so the L2 cache cannot hold them


@contextmanager
def swapped_to_static(ours: Ours, max_batch: int) -> Iterator[None]:
    """Our decode steps with the static-slot kernel: row ``i`` reads static slot ``i``."""
    fast = ours.kv.decode_graphs
    if fast is None:
        raise RuntimeError("ours does not use the Triton kernels (no CUDA or no Triton)")
    model, cache = ours.model, ours.kv.cache
    c = model.config
    shape = (max_batch + 1, c.num_kv_heads, model.max_seq_len, c.head_dim)
    layer_of = {k.data_ptr(): i for i, k in enumerate(cache.k)}
    static_k = [torch.zeros(shape, device=model.device, dtype=model.dtype) for _ in cache.k]
    static_v = [torch.zeros(shape, device=model.device, dtype=model.dtype) for _ in cache.v]
    slots = torch.arange(max_batch + 1, device=model.device)

    def attention(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        lengths: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        layer = layer_of[k_cache.data_ptr()]
        return slot_decode_attention(
            q, static_k[layer], static_v[layer], slots[: q.shape[0]], lengths, scale
        )

    original = paged_attention.paged_decode_attention
    # setattr: llama.py calls the kernel through the module, and the graphs must be
    # recorded again around the swapped kernel (and once more after it).
    setattr(paged_attention, "paged_decode_attention", attention)  # noqa: B010
    fast.drop_graphs()
    try:
        yield
    finally:
        setattr(paged_attention, "paged_decode_attention", original)  # noqa: B010
        fast.drop_graphs()
        static_k.clear()
        static_v.clear()
        torch.cuda.empty_cache()


def graph_us(calls: list[Callable[[], Any]], replays: int = 10) -> float:
    """Microseconds per call of ``calls`` replayed from one CUDA graph (no launch gaps)."""
    for call in calls:  # compile and warm outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * float(start.elapsed_time(end)) / (replays * len(calls))


def _caches(
    batch: int, context: int, heads: int, kv_heads: int, d: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Random paged K/V (each row's blocks consecutive, as the allocator hands them
    out), the static caches holding the same keys, and the query."""
    bs = 16
    per_row = -(-context // bs)
    k, v = torch.randn(2, kv_heads, batch * per_row + 1, bs, d, device=device, dtype=torch.bfloat16)
    tables = torch.arange(batch * per_row, device=device, dtype=torch.int32).view(batch, -1)

    def gathered(cache: torch.Tensor) -> torch.Tensor:
        rows = cache[:, tables.long()].flatten(2, 3)[:, :, :context].transpose(0, 1)
        return torch.cat([rows, rows[:1]]).contiguous()  # + a dummy slot

    return {
        "k": k,
        "v": v,
        "tables": tables,
        "static_k": gathered(k),
        "static_v": gathered(v),
        "lengths": torch.full((batch,), context, device=device, dtype=torch.int64),
        "slots": torch.arange(batch, device=device),
        "q": torch.randn(batch, heads, d, device=device, dtype=torch.bfloat16),
    }


def _static_call(c: dict[str, torch.Tensor], scale: float) -> Callable[[], torch.Tensor]:
    args = (c["q"], c["static_k"], c["static_v"], c["slots"], c["lengths"], scale)
    return partial(slot_decode_attention, *args)


def _paged_call(
    c: dict[str, torch.Tensor], scale: float, splits: int, floor: int
) -> Callable[[], torch.Tensor]:
    args = (c["q"], c["k"], c["v"], c["tables"], c["lengths"], scale)
    return partial(
        paged_attention.paged_decode_attention, *args, num_splits=splits, min_split=floor
    )


def sweep_point(
    batch: int, context: int, heads: int, kv_heads: int, d: int, device: torch.device
) -> dict[str, Any]:
    """Each kernel's microseconds at one (batch, context), and the paged-vs-static error."""
    copies = [_caches(batch, context, heads, kv_heads, d, device)]
    per_copy = 4 * copies[0]["k"].numel() * 2  # paged + static, K + V, bf16
    while len(copies) < min(32, math.ceil(ROTATE_BYTES / per_copy)):
        copies.append(_caches(batch, context, heads, kv_heads, d, device))
    scale = d**-0.5
    point: dict[str, Any] = {"batch": batch, "context": context, "copies": len(copies)}
    point["static_us"] = graph_us([_static_call(c, scale) for c in copies])
    for label, splits, floor in PAGED_SETTINGS:
        point[f"{label}_us"] = graph_us([_paged_call(c, scale, splits, floor) for c in copies])
    paged = _paged_call(copies[0], scale, paged_attention.NUM_SPLITS, paged_attention.MIN_SPLIT)()
    static = _static_call(copies[0], scale)()
    point["max_abs_diff_vs_static"] = float((paged.float() - static.float()).abs().max())
    point["paged_vs_static"] = point["static_us"] / point["paged_us"]
    return point


def attention_sweep(
    shape: dict[str, Any],
    device: torch.device,
    batches: list[int],
    contexts: list[int],
    left_s: Callable[[], float],
) -> dict[str, Any]:
    """``sweep_point`` over batches x contexts at ``shape``'s attention, while time is left."""
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    d = shape["hidden_size"] // heads
    points: list[dict[str, Any]] = []
    skipped = []
    for batch in batches:
        for context in contexts:
            if left_s() < 10:
                skipped.append([batch, context])
                continue
            points.append(sweep_point(batch, context, heads, kv_heads, d, device))
            torch.cuda.empty_cache()
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": d,
        "points": points,
        "skipped_for_time": skipped,
    }
