"""Input checks of the model's forward calls: clear ValueErrors instead of index errors.

A bad slot or position would otherwise write into another request's KV rows (or the
dummy slot) silently; the engine relies on these raising before any tensor is touched.
"""

from __future__ import annotations


def check_tokens(token_ids: list[int], vocab_size: int) -> None:
    if token_ids and not (min(token_ids) >= 0 and max(token_ids) < vocab_size):
        bad = next(t for t in token_ids if not 0 <= t < vocab_size)
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def check_prefill(
    slot: int, token_ids: list[int], num_slots: int, max_seq_len: int, vocab_size: int
) -> None:
    if not 0 <= slot < num_slots:
        raise ValueError(
            f"prefill slot must be in [0, {num_slots}) (slot {num_slots} is the dummy slot), "
            f"got {slot}"
        )
    if not 1 <= len(token_ids) <= max_seq_len:
        raise ValueError(f"prefill needs 1..{max_seq_len} tokens, got {len(token_ids)}")
    check_tokens(token_ids, vocab_size)


def check_decode(
    slots: list[int],
    token_ids: list[int],
    positions: list[int],
    num_slots: int,
    max_seq_len: int,
    vocab_size: int,
) -> None:
    """The dummy slot (``num_slots``) may appear, repeatedly, as batch padding."""
    if not slots:
        raise ValueError("decode needs at least one slot")
    if not len(slots) == len(token_ids) == len(positions):
        raise ValueError(
            f"slots, token_ids and positions must have equal lengths, got "
            f"{len(slots)}, {len(token_ids)}, {len(positions)}"
        )
    for slot in slots:
        if not 0 <= slot <= num_slots:
            raise ValueError(f"slot {slot} outside [0, {num_slots}]")
    real = [s for s in slots if s != num_slots]
    if len(set(real)) != len(real):
        raise ValueError(f"a slot appears twice in one decode batch: {slots}")
    for position in positions:
        if not 0 <= position < max_seq_len:
            raise ValueError(f"position {position} outside [0, {max_seq_len})")
    check_tokens(token_ids, vocab_size)
