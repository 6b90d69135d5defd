"""A fixed-bucket histogram of GEN TTFT (arrival at the GEN worker -> first GEN token).

A quantile cannot be differenced or summed, a histogram can: each worker keeps
cumulative bucket counts, the stat line carries the window's counts (current minus
previous), and the pool's histogram is the sum over workers. The replica scaler
reads the pool's p90 from it. Buckets grow geometrically (25 % wide), so the
interpolated quantile is within a bucket's width of the exact one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

FIRST_EDGE_S = 0.005
GROWTH = 1.25
NUM_EDGES = 46  # the last edge is about 116 s; a last bucket holds everything above
# Upper edges of the buckets; bucket i holds (EDGES[i-1], EDGES[i]], bucket 0 [0, EDGES[0]].
EDGES_S: tuple[float, ...] = tuple(FIRST_EDGE_S * GROWTH**k for k in range(NUM_EDGES))
NUM_BUCKETS = NUM_EDGES + 1


def bucket_of(seconds: float) -> int:
    """The bucket a TTFT falls into (negative or NaN times count as 0)."""
    if not seconds > 0:
        return 0
    return bisect.bisect_left(EDGES_S, seconds)


def window_counts(current: Sequence[int], previous: Sequence[int]) -> tuple[int, ...]:
    """``current - previous`` bucket by bucket; a missing previous counts as zeros."""
    return tuple(
        count - (previous[i] if i < len(previous) else 0) for i, count in enumerate(current)
    )


def summed(histograms: Iterable[Sequence[int]]) -> tuple[int, ...]:
    total = [0] * NUM_BUCKETS
    for counts in histograms:
        for i, count in enumerate(counts[:NUM_BUCKETS]):
            total[i] += count
    return tuple(total)


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0..1), linear within its bucket; ``None`` for an empty one.

    The overflow bucket has no upper edge: a quantile that lands there reads as the
    last edge, a lower bound, which is all a scaler needs ("far above target").
    """
    total = sum(counts)
    if total <= 0 or not 0 <= q <= 1:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count <= 0:
            continue
        if seen + count >= rank:
            low = 0.0 if i == 0 else EDGES_S[min(i, NUM_EDGES) - 1]
            high = EDGES_S[i] if i < NUM_EDGES else low
            return low + (high - low) * max(0.0, rank - seen) / count
        seen += count
    return EDGES_S[-1]  # pragma: no cover - rank <= total always lands above


def format_sparse(counts: Sequence[int]) -> str:
    """``3:5,4:12`` (bucket:count, zeros left out); ``-`` when empty."""
    return ",".join(f"{i}:{c}" for i, c in enumerate(counts) if c) or "-"


def parse_sparse(text: str) -> tuple[int, ...]:
    """Inverse of :func:`format_sparse`; raises ``ValueError`` on anything else."""
    counts = [0] * NUM_BUCKETS
    if text == "-":
        return tuple(counts)
    for item in text.split(","):
        index, sep, count = item.partition(":")
        i, c = int(index), int(count)
        if not sep or not 0 <= i < NUM_BUCKETS or c < 0:
            raise ValueError(f"bad histogram item {item!r}")
        counts[i] += c
    return tuple(counts)
