"""The edge's numeric limits (docs/worker.md#http-api): what every count and token id of
a body is bounded by, and the served model's vocabulary, passed to the pydantic models
of ``api`` as their validation context. No torch."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationInfo

# Every count and token id a body carries is at most this (a 32-bit integer): a larger one
# is a 422 at the edge, never an overflow in the engine. Token ids are also checked
# against the served model's vocabulary (``EdgeLimits``).
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**63 - 1  # a torch generator's seed is a signed 64-bit integer
__all__ = ["MAX_COUNT", "MAX_SEED", "EdgeLimits", "check_token_ids", "int_as_float"]


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """What the edge checks a body against besides its schema: the served model's
    vocabulary (token ids; None: unknown). Passed as pydantic's validation context."""

    vocab_size: int | None = None


def int_as_float(value: object) -> object:
    """JSON integers where a number is wanted; one too large for a float is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ValueError("number too large") from None
    return value


def check_token_ids(ids: list[int], info: ValidationInfo) -> list[int]:
    """Token ids in [0, vocab) (the model's, when the context gives it; else MAX_COUNT)."""
    limits = info.context if isinstance(info.context, EdgeLimits) else EdgeLimits()
    bound = MAX_COUNT + 1 if limits.vocab_size is None else limits.vocab_size
    bad = [t for t in ids if not 0 <= t < bound]
    if bad:
        raise ValueError(f"token ids out of range [0, {bound}): {bad[:5]}")
    return ids
