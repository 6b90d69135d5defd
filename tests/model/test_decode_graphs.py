"""GraphedDecode's inputs, eagerly on the CPU (the graphs themselves need CUDA).

The step must see each row's block table padded with the dummy block to the table
width, in int32, and the rows that did not change must not be rebuilt: the device
buffer is rewritten only when a row differs.
"""

from __future__ import annotations

import pytest
import torch

from genpool_worker.model.decode_graphs import BlockTables, GraphedDecode, dense_tables

DUMMY, WIDTH = 9, 4


def _recording() -> tuple[list[tuple[torch.Tensor, ...]], GraphedDecode]:
    seen: list[tuple[torch.Tensor, ...]] = []

    def step(tables: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        seen.append((tables.clone(), tokens.clone(), positions.clone()))
        return torch.zeros(tokens.shape[0], 5)

    decode = GraphedDecode(
        step,
        max_batch=3,  # buckets 1, 2, 4
        max_blocks_per_seq=WIDTH,
        dummy_block=DUMMY,
        device=torch.device("cpu"),
        graphs=False,
    )
    return seen, decode


def test_the_step_sees_dummy_padded_int32_tables_and_int64_rows() -> None:
    seen, decode = _recording()
    logits = decode.run([[3, 1], [0, 2, 5]], [7, 8], [20, 40])
    assert logits.shape == (2, 5)
    tables, tokens, positions = seen[-1]
    assert tables.dtype == torch.int32 and tokens.dtype == positions.dtype == torch.int64
    assert tables.tolist() == [[3, 1, DUMMY, DUMMY], [0, 2, 5, DUMMY]]
    assert tokens.tolist() == [7, 8] and positions.tolist() == [20, 40]


def test_a_smaller_batch_in_the_same_bucket_drops_the_stale_rows() -> None:
    seen, decode = _recording()
    decode.run([[3], [1], [2]], [1, 2, 3], [0, 0, 0])  # bucket 4
    decode.run([(4, 0)], [1], [5])  # bucket 1, a tuple table
    decode.run([[3], [6]], [1, 2], [1, 1])  # bucket 2
    assert [s[0].tolist() for s in seen[1:]] == [
        [[4, 0, DUMMY, DUMMY]],
        [[3, DUMMY, DUMMY, DUMMY], [6, DUMMY, DUMMY, DUMMY]],
    ]


def test_beyond_the_largest_bucket_runs_one_off_tables() -> None:
    seen, decode = _recording()
    decode.run([[i] for i in range(5)], [0] * 5, [0] * 5)
    assert seen[-1][0].tolist() == [[i, DUMMY, DUMMY, DUMMY] for i in range(5)]


def test_unchanged_rows_are_not_copied_again() -> None:
    tables = BlockTables(3, WIDTH, DUMMY, torch.device("cpu"))
    first = tables.update([[1, 2], [3]]).clone()
    tables.device_tables.fill_(-1)  # stands for a buffer nobody should rewrite
    assert (tables.update([[1, 2], (3,)]) == -1).all()  # same contents: no copy
    assert tables.update([[1, 2], [4]]).tolist() == [
        [1, 2, DUMMY, DUMMY],
        [4, DUMMY, DUMMY, DUMMY],
        [DUMMY] * WIDTH,
    ]
    assert first[2].tolist() == [DUMMY] * WIDTH
    tables.clear()
    assert (tables.device_tables == DUMMY).all()


def test_a_table_wider_than_the_width_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 4 fit"):
        BlockTables(1, WIDTH, DUMMY, torch.device("cpu")).update([[1, 2, 3, 4, 5]])
    with pytest.raises(ValueError, match="at most 4 fit"):
        dense_tables([[1, 2, 3, 4, 5]], WIDTH, DUMMY)
    with pytest.raises(ValueError, match="2 block tables for 1 rows"):
        BlockTables(1, WIDTH, DUMMY, torch.device("cpu")).update([[1], [2]])


def test_the_check_refuses_a_batch_before_the_step_runs() -> None:
    """The cache engine hands its network's decode checks in: a graph replays whatever
    block ids it is given, so a bad batch must be refused before any table is written."""
    seen: list[int] = []

    def step(tables: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        seen.append(tokens.shape[0])
        return torch.zeros(tokens.shape[0], 5)

    def check(tables: object, tokens: list[int], positions: list[int]) -> None:
        if DUMMY in tokens:
            raise ValueError("refused")

    decode = GraphedDecode(step, max_batch=2, max_blocks_per_seq=WIDTH, dummy_block=DUMMY,
                           device=torch.device("cpu"), graphs=False, check=check)  # fmt: skip
    with pytest.raises(ValueError, match="refused"):
        decode.run([[1]], [DUMMY], [0])
    assert not seen
    decode.run([[1]], [3], [0])
    assert seen == [1]
