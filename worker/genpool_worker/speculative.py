"""Speculative decoding's configuration (``--speculative-config``) and its n-gram drafter
(docs/worker.md#speculative-decoding): prompt lookup, vLLM's ``ngram`` method. The other
drafter, ``early_exit`` (the target's first layers), is ``drafters.py``'s.

The n-gram drafter proposes the tokens that followed the latest earlier occurrence of the
request's last n tokens (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``),
in its prompt and output so far. It needs no model and is a pure function of the
token history, so every tensor-parallel rank drafts the same tokens without an
exchange. Its state (an index of where each n-gram last ended) lives with the request
in the runner and is extended as tokens are emitted: a paused request keeps it in
place and, resumed, drafts from its whole history (DESIGN.md 7.1's change: a resume
is not a fresh arrival with an empty drafter context).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from genpool_core.names import MAX_PROMPT_LOOKUP, MAX_SPECULATIVE_TOKENS

FLAG = "--speculative-config"
DEFAULT_LOOKUP = 5  # vLLM's, when neither size is given


class SpeculativeConfig(BaseModel):
    """vLLM's ``--speculative-config`` fields: ``method: ngram`` with its lookup sizes, or
    ``method: early_exit`` (self-speculation) with ``num_draft_layers``, the target's
    first layers that draft (fewer than it has: checked when the model loads)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    method: Literal["ngram", "early_exit"]
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS)
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=MAX_PROMPT_LOOKUP)
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=MAX_PROMPT_LOOKUP)
    num_draft_layers: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _method_options(self) -> SpeculativeConfig:
        if self.method == "early_exit":
            if self.num_draft_layers is None:
                raise ValueError("method early_exit needs num_draft_layers")
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError("prompt_lookup_min/max are options of method ngram only")
            return self
        if self.num_draft_layers is not None:
            raise ValueError("num_draft_layers is an option of method early_exit only")
        low, high = self.lookup_range
        if low > high:
            raise ValueError(f"prompt_lookup_min ({low}) is above prompt_lookup_max ({high})")
        return self

    @property
    def lookup_range(self) -> tuple[int, int]:
        """(min, max) n-gram sizes, vLLM's defaults: both unset is 5, one unset the other."""
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            return DEFAULT_LOOKUP, DEFAULT_LOOKUP
        return (low or high or DEFAULT_LOOKUP), (high or low or DEFAULT_LOOKUP)


class DrafterModelError(ValueError):
    """The configured drafter cannot run on the loaded model (known once it is read)."""


def parse_speculative_config(text: str) -> SpeculativeConfig:
    """The flag's JSON object, checked; a ``ValueError`` naming the flag in one line."""
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{FLAG} is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{FLAG} must be a JSON object, got {type(loaded).__name__}")
    try:
        return SpeculativeConfig.model_validate(loaded)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ValueError(f"{FLAG}: {problems}") from None


class NgramDrafter:
    """One request's n-gram index over its tokens: ``extend`` as tokens come, ``propose``
    drafts after the last one.

    ``_ends[g]`` is the position after the latest occurrence of n-gram ``g``, counting
    only occurrences that end before the newest token, so a lookup of the history's own
    suffix finds an earlier occurrence and at least one token follows it.
    """

    def __init__(self, tokens: Sequence[int], min_n: int, max_n: int) -> None:
        self._min_n, self._max_n = min_n, max_n
        self._tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens of history it drafts from (prompt and output so far)."""
        return len(self._tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._index_before_newest()
            self._tokens.append(token)

    def _index_before_newest(self) -> None:
        """The n-grams ending at the current newest token become findable."""
        end = len(self._tokens)
        for n in range(self._min_n, min(self._max_n, end) + 1):
            self._ends[tuple(self._tokens[end - n : end])] = end

    def propose(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` drafts: what followed the longest suffix seen before."""
        tokens = self._tokens
        if max_tokens <= 0:
            return []
        for n in range(min(self._max_n, len(tokens) - 1), self._min_n - 1, -1):
            end = self._ends.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end : end + max_tokens]
        return []


@dataclass
class SpecDecodeCounts:
    """What verification did since the worker started (vLLM's ``spec_decode`` counters):
    requests that verified drafts (``num_drafts``, once per request per step), drafted
    tokens verified, drafted tokens accepted, and accepted ones by draft position."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def count(self, drafted: Mapping[str, int], accepted: Mapping[str, Sequence[int]]) -> None:
        self.num_drafts += len(drafted)
        self.num_draft_tokens += sum(drafted.values())
        for request_id in drafted:
            num_accepted = len(accepted.get(request_id, ()))
            self.num_accepted_tokens += num_accepted
            for position in range(num_accepted):
                if position == len(self.accepted_per_position):
                    self.accepted_per_position.append(0)
                self.accepted_per_position[position] += 1

    def copy(self) -> SpecDecodeCounts:
        """A copy that later counting leaves as it is (the engine's snapshot)."""
        return replace(self, accepted_per_position=list(self.accepted_per_position))

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted tokens (None before any draft)."""
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens
