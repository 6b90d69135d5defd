"""The decode step's input check that walks only changed block tables
(``model.checks.DecodeCheck``): it refuses exactly what the full ``check_decode``
refuses, step after step, and a table it has checked is not walked again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_worker.model.checks import DecodeCheck, check_decode

GEOMETRY = (24, 4, 32)  # 24 blocks (block 24 is the dummy) of 4 tokens, max_seq_len 32
VOCAB = 50
PADDING: tuple[int, ...] = (24,)


def _outcome(check: object, tables: list[tuple[int, ...]], positions: list[int]) -> str:
    """ "ok" or "refused" (with two faults in one step, the two may name different ones)."""
    try:
        check(tables, [1] * len(tables), positions, GEOMETRY, VOCAB)  # type: ignore[operator]
    except ValueError:
        return "refused"
    return "ok"


TABLE = st.lists(st.integers(0, 25), min_size=1, max_size=9).map(tuple)
STEP = st.lists(st.tuples(st.integers(0, 5), TABLE, st.integers(0, 40)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=12))
def test_it_refuses_exactly_what_the_full_check_refuses(steps: list[list[tuple]]) -> None:  # type: ignore[type-arg]
    """Rows reuse table objects across steps (slot k keeps its tuple until replaced),
    as the runner's rows do; some tables are padding, some collide, some are invalid."""
    incremental = DecodeCheck()
    slots: dict[int, tuple[int, ...]] = {}
    for step in steps:
        tables: list[tuple[int, ...]] = []
        positions: list[int] = []
        for slot, fresh, position in step:
            if slot == 5:
                table = PADDING
            else:
                table = slots.setdefault(slot, fresh) if position % 3 else fresh
                slots[slot] = table
            tables.append(table)
            positions.append(position % 33)
        full = _outcome(check_decode, tables, positions)
        assert _outcome(incremental, tables, positions) == full


class CountingTuple(tuple[int, ...]):
    walks = 0

    def __iter__(self) -> Iterator[int]:
        CountingTuple.walks += 1
        return super().__iter__()


def test_a_table_it_has_checked_is_not_walked_again() -> None:
    check = DecodeCheck()
    a, b = CountingTuple((0, 1, 2)), CountingTuple((3, 4))
    check([a, b], [1, 2], [5, 3], GEOMETRY, VOCAB)
    walked = CountingTuple.walks
    for step in range(5):
        check([a, b], [1, 2], [6 + step, 4], GEOMETRY, VOCAB)
    assert CountingTuple.walks == walked  # the same rows: no block walked
    c = CountingTuple((5, 2))  # block 2 is a's, and c writes into it
    with pytest.raises(ValueError, match="two rows"):
        check([a, c], [1, 2], [6, 5], GEOMETRY, VOCAB)
    d = CountingTuple((3, 5))  # b left, so its block 3 is free again
    check([a, d], [1, 2], [6, 1], GEOMETRY, VOCAB)
    with pytest.raises(ValueError, match="past the row's 2 KV blocks"):
        check([a, d], [1, 2], [6, 8], GEOMETRY, VOCAB)  # positions: checked every step


@pytest.mark.parametrize("check", [check_decode, DecodeCheck()], ids=["full", "incremental"])
def test_rows_may_read_a_shared_prefix_but_not_write_into_it(check: object) -> None:
    """The prefix cache shares a prompt's full blocks: rows reading them decode together
    (before, a shared block refused the batch and every row decoded alone)."""
    a, b = (7, 0, 1), (7, 0, 2)  # blocks 7 and 0: one cached prefix; 1 and 2 their own
    assert _outcome(check, [a, b], [9, 10]) == "ok"  # both write their third block
    assert _outcome(check, [a, b], [5, 9]) == "refused"  # a writes block 0, b holds it
