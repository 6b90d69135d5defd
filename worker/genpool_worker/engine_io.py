"""What crosses the engine's boundary: model and tokenizer protocols, a request's
engine state, and the per-pass inputs that rank 0 broadcasts (docs/design.md#multi-rank)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from genpool_core.stats import SchedulerStats


class DecodeModel(Protocol):
    name: str
    is_synthetic: bool
    eos_token_id: int | None
    num_slots: int
    max_seq_len: int

    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor: ...

    def decode(
        self, slots: list[int], token_ids: list[int], positions: list[int]
    ) -> torch.Tensor: ...


class Tokenizer(Protocol):
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(eq=False)
class EngineRequest:
    """One request's engine state; on rank 0 events go back to its HTTP handler."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop | None
    temperature: float = 0.0
    seed: int | None = None
    arrival_time: float | None = None
    first_token_time: float | None = None
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    text_sent: int = 0
    generator: torch.Generator | None = None

    def emit(self, *event: Any) -> None:
        if self.loop is not None:  # followers (ranks > 0) have no client
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def arrival(self) -> Arrival:
        return Arrival(
            self.request_id,
            self.prompt_ids,
            self.max_tokens,
            self.temperature,
            self.seed,
            self.arrival_time,
            self.first_token_time,
        )


@dataclass(frozen=True)
class Arrival:
    """What every rank must know about a new request (broadcast by rank 0)."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int | None
    arrival_time: float | None
    first_token_time: float | None

    def to_request(self) -> EngineRequest:
        return EngineRequest(
            self.request_id,
            self.prompt_ids,
            self.max_tokens,
            None,
            self.temperature,
            self.seed,
            self.arrival_time,
            self.first_token_time,
        )


@dataclass(frozen=True)
class PassInputs:
    """Everything a pass depends on besides the model's outputs (docs/design.md#multi-rank).

    Rank 0 fills it from its clock and inboxes; with N ranks it is broadcast, so every
    rank's scheduler sees bit-identical inputs and makes identical decisions.
    ``prev_end`` is when the previous pass's model step ended (its postprocess time).
    """

    now: float
    prev_end: float | None
    arrivals: list[Arrival]
    aborts: list[str]
    configs: list[dict[str, Any]]
    stop: bool = False


class Coordinator(Protocol):
    rank: int

    def exchange(self, inputs: PassInputs | None) -> PassInputs: ...


class LocalCoordinator:
    """One rank: the inputs are already everyone's."""

    rank = 0

    def exchange(self, inputs: PassInputs | None) -> PassInputs:
        assert inputs is not None
        return inputs


@dataclass(frozen=True)
class EngineSnapshot:
    stats: SchedulerStats
    stat_line: str
    config: dict[str, Any]
    inflight: int
    tokens_total: int
    passes: int
