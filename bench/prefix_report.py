"""The prefix-cache bench's arithmetic (``bench.prefix_chat``), pure and unit-tested:
the oracle hit rate of a trace, per-turn TTFT summaries and the paired ratio of two
setups."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from genpool_core.quantiles import percentile


def _chain(tokens: Sequence[int], block_size: int, num_blocks: int) -> list[tuple[int, ...]]:
    """Each of the first ``num_blocks`` full blocks keyed by every token up to its end."""
    return [tuple(tokens[: (i + 1) * block_size]) for i in range(num_blocks)]


def oracle_hit_tokens(
    prompts: Sequence[Sequence[int]], computed: Sequence[Sequence[int]], block_size: int
) -> list[int]:
    """Per request, the prompt tokens an infinite prefix cache would hold: the longest
    run of whole blocks from its start that an earlier request had computed (its prompt
    and output, ``computed``), leaving at least one prompt token to compute (as the
    worker does). The trace's order is the arrival order."""
    seen: set[tuple[int, ...]] = set()
    hits: list[int] = []
    for prompt, done in zip(prompts, computed, strict=True):
        limit = (len(prompt) - 1) // block_size
        count = 0
        for key in _chain(prompt, block_size, limit):
            if key not in seen:
                break
            count += 1
        hits.append(count * block_size)
        seen.update(_chain(done, block_size, len(done) // block_size))
    return hits


@dataclass(frozen=True)
class Turn:
    """One streamed chat turn as the client saw it."""

    conversation: int
    index: int  # 0: the first turn (nothing of it can be cached but a shared prefix)
    ttft_s: float
    text: str
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None


def ttft_summary(turns: Sequence[Turn], *, from_turn: int = 1) -> dict[str, float]:
    """TTFT p50 / p90 / mean (s) of the turns from ``from_turn`` on, and how many."""
    values = [t.ttft_s for t in turns if t.index >= from_turn and t.error is None]
    if not values:
        return {"n": 0.0}
    return {
        "n": float(len(values)),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "mean": statistics.fmean(values),
    }


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """a / b per pair (runs of two setups made side by side): mean and range."""
    ratios = [x / y for x, y in zip(a, b, strict=True) if y > 0]
    if not ratios:
        return {}
    return {"mean": statistics.fmean(ratios), "min": min(ratios), "max": max(ratios)}


def texts_equal(a: Sequence[Turn], b: Sequence[Turn]) -> bool:
    """Both setups produced the same text for every (conversation, turn)."""
    key = {(t.conversation, t.index): t.text for t in a}
    return len(a) == len(b) and all(key.get((t.conversation, t.index)) == t.text for t in b)
