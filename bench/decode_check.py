"""The decode step's input check, whole against incremental (issue 36, item 2).

    python -m bench.run decode_check

Every decode step checks its block tables before a tensor is touched
(``genpool_worker.model.checks``). The full check walks every reserved block of every
row in Python; ``DecodeCheck`` walks only the tables that changed since its last step.
Measured at the GPU check's shape (batch 128, 8192-token contexts in blocks of 16: 512
blocks a row, 65,536 a step), side by side in one run, for steps where no row changes
and steps where one row's table is replaced (a finish and an admission). CPU time of the
check alone, which a GPU step (about 6.5 ms at that shape) waits for.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from genpool_worker.model.checks import DecodeCheck, check_decode

BATCH, BLOCKS_PER_ROW, BLOCK_SIZE, MAX_SEQ_LEN = 128, 512, 16, 8192
SPARE = BLOCKS_PER_ROW  # room for one replacement table
GEOMETRY = (BATCH * BLOCKS_PER_ROW + SPARE, BLOCK_SIZE, MAX_SEQ_LEN)
VOCAB = 49152


def _batch() -> tuple[list[tuple[int, ...]], list[int], list[int]]:
    tables = [tuple(range(r * BLOCKS_PER_ROW, (r + 1) * BLOCKS_PER_ROW)) for r in range(BATCH)]
    return tables, [1] * BATCH, [MAX_SEQ_LEN - 1] * BATCH


def _time(check: Any, steps: int, churn: bool) -> list[float]:
    """Microseconds per step; with ``churn`` one row's table is replaced every step (the
    replaced table's blocks become the spare ones, so tables stay disjoint)."""
    tables, tokens, positions = _batch()
    spare = tuple(range(BATCH * BLOCKS_PER_ROW, GEOMETRY[0]))
    check(tables, tokens, positions, GEOMETRY, VOCAB)  # the first sight: a full walk
    times = []
    for step in range(steps):
        if churn:
            row = step % BATCH
            tables[row], spare = spare, tables[row]
        start = time.perf_counter_ns()
        check(tables, tokens, positions, GEOMETRY, VOCAB)
        times.append((time.perf_counter_ns() - start) / 1e3)
    return times


def run(*, quick: bool = False) -> dict[str, Any]:
    steps = 20 if quick else 200
    result: dict[str, Any] = {
        "benchmark": "decode_check",
        "shape": {"batch": BATCH, "blocks_per_row": BLOCKS_PER_ROW, "block_size": BLOCK_SIZE},
        "steps": steps,
    }
    for churn in (False, True):
        full = _time(check_decode, steps, churn)
        incremental = _time(DecodeCheck(), steps, churn)
        case = "one_row_changes" if churn else "no_row_changes"
        result[case] = {
            "full_median_us": round(statistics.median(full), 1),
            "incremental_median_us": round(statistics.median(incremental), 1),
            "ratio": round(statistics.median(incremental) / statistics.median(full), 4),
        }
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = ["case                 full us   incremental us   ratio"]
    for case in ("no_row_changes", "one_row_changes"):
        row = result[case]
        lines.append(f"{case:18} {row['full_median_us']:>9} {row['incremental_median_us']:>16}"
                     f" {row['ratio']:>7}")  # fmt: skip
    return "\n".join(lines)
