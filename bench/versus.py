"""A side-by-side bench's row: the shipped way beside the one it replaced, best of the
repeats, in microseconds, with the ratio old / new (bench.detokenize, bench.penalties)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def versus_row(label: tuple[str, int], new: tuple[str, float], old: tuple[str, float],
               digits: int) -> dict[str, Any]:  # fmt: skip
    """``{label, new_key: us, old_key: us, ratio}`` from (key, seconds) pairs."""
    (new_key, new_s), (old_key, old_s) = new, old
    return {label[0]: label[1], new_key: round(new_s * 1e6, digits),
            old_key: round(old_s * 1e6, digits), "ratio": round(old_s / new_s, 1)}  # fmt: skip


def versus_table(rows: Sequence[Mapping[str, Any]], headers: Sequence[str]) -> str:
    """The rows' columns in order under ``headers`` (the last, the ratio, with an x)."""
    widths = [max(len(header), 9) for header in headers]
    lines = [" ".join(f"{h:>{w}}" for h, w in zip(headers, widths, strict=True))]
    for row in rows:
        cells = [*map(str, list(row.values())[:-1]), f"{row['ratio']}x"]
        lines.append(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    return "\n".join(lines)
