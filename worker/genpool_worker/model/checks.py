"""Input checks of the model's forward calls: clear ValueErrors instead of index errors.

A bad block or position would otherwise write into another request's KV rows (or the
dummy block) silently; the engine relies on these raising before any tensor is touched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .config import LlamaConfig

# Decode writes one position per row: into a block only that row may hold. Rows reading
# the same full blocks (a prefix the cache shares) is fine; writing into one is not.
SHARED_WRITE = "a KV block a row writes is in two rows of one decode batch"


def check_sizes(config: LlamaConfig, max_seq_len: int) -> None:
    if not 1 <= max_seq_len <= config.context_length:
        raise ValueError(
            f"max_seq_len must be in [1, {config.context_length}] (the model's context "
            f"length), got {max_seq_len}"
        )


def check_tokens(token_ids: list[int], vocab_size: int) -> None:
    if token_ids and not (min(token_ids) >= 0 and max(token_ids) < vocab_size):
        bad = next(t for t in token_ids if not 0 <= t < vocab_size)
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def check_blocks(blocks: Sequence[int], num_blocks: int) -> None:
    if not blocks:
        raise ValueError("a request needs at least one KV block")
    for block in blocks:
        if not 0 <= block < num_blocks:
            raise ValueError(
                f"KV block {block} outside [0, {num_blocks}) (block {num_blocks} is the dummy)"
            )
    if len(set(blocks)) != len(blocks):
        raise ValueError(f"a KV block appears twice in one block table: {list(blocks)}")


def check_prefill(
    blocks: Sequence[int],
    token_ids: list[int],
    geometry: tuple[int, int, int],
    vocab_size: int,
) -> None:
    """``geometry``: (num_blocks, block_size, max_seq_len)."""
    num_blocks, block_size, max_seq_len = geometry
    check_blocks(blocks, num_blocks)
    if not 1 <= len(token_ids) <= max_seq_len:
        raise ValueError(f"prefill needs 1..{max_seq_len} tokens, got {len(token_ids)}")
    if len(token_ids) > len(blocks) * block_size:
        raise ValueError(
            f"{len(token_ids)} tokens do not fit {len(blocks)} KV blocks of {block_size}"
        )
    check_tokens(token_ids, vocab_size)


def check_decode(
    block_tables: Sequence[Sequence[int]],
    token_ids: list[int],
    positions: list[int],
    geometry: tuple[int, int, int],
    vocab_size: int,
) -> None:
    """A row whose table is the dummy block alone is batch padding (at position 0).

    Rows may share blocks (the prefix cache shares a prompt's full blocks, read-only),
    but the block a row writes this step must be in no other row's table."""
    _check_rows(block_tables, token_ids, positions, geometry)
    held: Counter[int] = Counter()
    for table in block_tables:
        if not _is_padding(table, geometry[0]):
            _check_table(table, geometry)
            held.update(table)
    _check_writes(block_tables, positions, geometry, held)
    check_tokens(token_ids, vocab_size)


def _check_writes(block_tables: Sequence[Sequence[int]], positions: list[int],
                  geometry: tuple[int, int, int], held: Counter[int]) -> None:  # fmt: skip
    """Each real row's written block (``table[position // block_size]``) is its alone."""
    num_blocks, block_size = geometry[0], geometry[1]
    for table, position in zip(block_tables, positions, strict=True):
        if not _is_padding(table, num_blocks) and held[table[position // block_size]] != 1:
            raise ValueError(SHARED_WRITE)


def _is_padding(table: Sequence[int], num_blocks: int) -> bool:
    return len(table) == 1 and table[0] == num_blocks


def _check_table(table: Sequence[int], geometry: tuple[int, int, int]) -> None:
    num_blocks, block_size, max_seq_len = geometry
    check_blocks(table, num_blocks)
    if len(table) > -(-max_seq_len // block_size):
        raise ValueError(
            f"a block table of {len(table)} blocks is longer than --max-seq-len="
            f"{max_seq_len} needs ({-(-max_seq_len // block_size)} of {block_size})"
        )


class DecodeCheck:
    """``check_decode`` that remembers the block tables it has checked: a table it has
    seen (an immutable tuple, known by identity and kept alive here) is not walked
    again, so a step costs the rows whose table changed plus one lookup per row (its
    written block), not every reserved block of every row (about 65k at batch 128 with
    8k-token contexts, a Python loop each step). Positions, padding rows, written blocks
    and token ids are checked every step. A table that is not a tuple, or any error,
    falls back to the full check from scratch."""

    def __init__(self) -> None:
        self._tables: dict[int, tuple[int, ...]] = {}  # id -> a checked table (kept alive)
        self._held: Counter[int] = Counter()  # how many of those tables hold each block
        self._geometry: tuple[int, int, int] | None = None

    def __call__(self, block_tables: Sequence[Sequence[int]], token_ids: list[int],
                 positions: list[int], geometry: tuple[int, int, int],
                 vocab_size: int) -> None:  # fmt: skip
        try:
            self._check(block_tables, token_ids, positions, geometry, vocab_size)
        except ValueError:
            self._forget()
            raise

    def _check(self, block_tables: Sequence[Sequence[int]], token_ids: list[int],
               positions: list[int], geometry: tuple[int, int, int],
               vocab_size: int) -> None:  # fmt: skip
        real = [t for t in block_tables if not _is_padding(t, geometry[0])]
        tables = [t for t in real if isinstance(t, tuple)]
        if len(tables) != len(real):  # a mutable table could change unseen: walk all
            self._forget()
            check_decode(block_tables, token_ids, positions, geometry, vocab_size)
            return
        if geometry != self._geometry:  # nothing remembered holds: every table is new
            self._forget()
            self._geometry = geometry
        _check_rows(block_tables, token_ids, positions, geometry)
        current = {id(table): table for table in tables}
        if len(current) != len(tables):  # one table in two rows: both write its block
            raise ValueError(SHARED_WRITE)
        for key in [k for k in self._tables if k not in current]:  # rows that left
            self._held.subtract(self._tables.pop(key))
        for key, table in current.items():
            if key not in self._tables:
                _check_table(table, geometry)
                self._held.update(table)
                self._tables[key] = table
        _check_writes(block_tables, positions, geometry, self._held)
        check_tokens(token_ids, vocab_size)

    def _forget(self) -> None:
        self._tables, self._held, self._geometry = {}, Counter(), None


def _check_rows(block_tables: Sequence[Sequence[int]], token_ids: list[int],
                positions: list[int], geometry: tuple[int, int, int]) -> None:  # fmt: skip
    """The per-step checks of every row: lengths, positions, padding rows."""
    num_blocks, block_size, max_seq_len = geometry
    if not block_tables:
        raise ValueError("decode needs at least one row")
    if not len(block_tables) == len(token_ids) == len(positions):
        raise ValueError(
            f"block tables, token_ids and positions must have equal lengths, got "
            f"{len(block_tables)}, {len(token_ids)}, {len(positions)}"
        )
    for table, position in zip(block_tables, positions, strict=True):
        if not 0 <= position < max_seq_len:
            raise ValueError(f"position {position} outside [0, {max_seq_len})")
        if _is_padding(table, num_blocks):
            if position != 0:
                raise ValueError(f"a padding row (the dummy block) decodes at 0, got {position}")
        elif not table:
            raise ValueError("a request needs at least one KV block")
        elif position // block_size >= len(table):
            raise ValueError(f"position {position} is past the row's {len(table)} KV blocks")
