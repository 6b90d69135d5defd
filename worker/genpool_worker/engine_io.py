"""What crosses the engine's boundary: the model runner and tokenizer protocols, a
request's engine state, the per-pass inputs that rank 0 broadcasts
(docs/design.md#multi-rank) and the snapshot the HTTP side reads. No torch here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from genpool_core.block_hash import BlockHash
from genpool_core.kv_blocks import KVEvent
from genpool_core.live import LiveUpdate
from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason, GenRequest
from genpool_core.statline import StatLine, format_statline
from genpool_core.stats import SchedulerStats
from genpool_worker.detokenizer import IncrementalDetokenizer
from genpool_worker.events import EngineEvent
from genpool_worker.kv_connector import KVExecutionSide, KVTransfer
from genpool_worker.sampling_params import SamplingParams, TokenLogprobs
from genpool_worker.speculative import SpecDecodeCounts
from genpool_worker.stop_strings import StopMatcher


class Tokenizer(Protocol):
    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the loop and the HTTP side know of the model (``vocab_size`` None: unknown)."""

    name: str
    is_synthetic: bool
    max_seq_len: int
    eos_token_ids: tuple[int, ...]  # every id that ends a generation, the primary first
    vocab_size: int | None = None
    num_kv_blocks: int = 0  # the KV cache's blocks (0: a runner without a paged cache)
    kv_block_size: int = 0  # tokens per block


@dataclass(frozen=True, slots=True)
class StepResult:
    """One pass's output: a token for every batch member (after its accepted drafts),
    and the logprobs asked for."""

    tokens: dict[str, int]
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # Requests that failed this pass (request id -> why): each fails alone, the rest go on.
    failed: dict[str, str] = field(default_factory=dict)
    # Speculative decoding: the drafted tokens a request emitted this pass before its
    # token in ``tokens`` (absent: none were accepted).
    accepted: dict[str, list[int]] = field(default_factory=dict)
    drafted: dict[str, int] = field(default_factory=dict)  # drafts each verified this pass
    # Drafts proposed for each member's next step (the next plan states them).
    drafts: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Arrival:
    """What every rank must know about a new request (broadcast by rank 0, whole).

    ``slo_ttft_s`` and ``target_output_tps`` are this request's own admission target
    (D_i, seconds) and output-rate floor (T_i, tokens/s); None uses the pool's.
    ``stop``: OpenAI stop strings; the text ends before the first one completed and the
    request finishes as a stop (every rank decodes, so all see the match in one pass).
    ``kv_transfer``: what its KV does besides being computed here (``kv_connector``).
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()  # noqa: RUF009 (frozen: one shared default)
    arrival_time: float | None = None
    first_token_time: float | None = None
    slo_ttft_s: float | None = None
    target_output_tps: float | None = None
    stop: tuple[str, ...] = ()
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    kv_transfer: KVTransfer = KVTransfer()  # noqa: RUF009 (frozen: one shared default)

    def gen_request(self, now: float, block_hashes: list[BlockHash] | None = None) -> GenRequest:
        """What the scheduler queues (an arrival stamped later than ``now`` is clamped);
        ``block_hashes``: its prompt's full blocks' prefix-cache hashes."""
        return GenRequest(
            request_id=self.request_id,
            prompt_len=len(self.prompt_ids),
            max_tokens=self.max_tokens,
            arrival_time=None if self.arrival_time is None else min(self.arrival_time, now),
            first_token_time=self.first_token_time,
            # A loaded request's first token was made with its KV, elsewhere.
            num_output_tokens=1 if self.kv_transfer.is_loaded else 0,
            slo_ttft_s=self.slo_ttft_s,
            target_output_tps=self.target_output_tps,
            holds_kv_at_finish=self.kv_transfer.holds_kv_at_finish,
            block_hashes=block_hashes or [],
        )


class ModelRunner(Protocol):
    """Owns the model: prefill, decode, sampling and each request's generator."""

    info: ModelInfo

    def add_request(self, arrival: Arrival) -> None: ...

    def remove_request(self, request_id: str) -> None: ...

    def execute(self, plan: GenPlan, kv: KVExecutionSide) -> StepResult:
        """One token for every batch member: ``plan.prefill_ids`` prefill, the rest decode;
        ``plan.imported_ids`` decode from the KV ``kv`` loads into their blocks."""
        ...


@dataclass(eq=False)
class EngineRequest:
    """One request's engine state; on rank 0 events go back to its HTTP handler."""

    arrival: Arrival
    loop: asyncio.AbstractEventLoop | None = None  # None on followers: no client
    events: asyncio.Queue[EngineEvent] = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    detokenizer: IncrementalDetokenizer = field(default_factory=IncrementalDetokenizer)
    stop_matcher: StopMatcher | None = field(init=False, default=None)
    # Sampled tokens (and logprobs) whose text has not gone out yet (logprobs asked for).
    unsent_logprobs: list[tuple[int, TokenLogprobs | None]] = field(default_factory=list)
    received_at: float = 0.0  # Unix s of the HTTP receipt (an export's timings start here)
    prefill_started_at: float | None = None  # Unix s, set by the engine (its first chunk)
    first_token_at: float | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held at its admission
    gen: GenRequest | None = None  # the scheduler's request, once queued

    def __post_init__(self) -> None:
        if self.arrival.stop:
            self.stop_matcher = StopMatcher(self.arrival.stop)

    @property
    def is_stop_matched(self) -> bool:
        return self.stop_matcher is not None and self.stop_matcher.is_stopped

    @property
    def request_id(self) -> str:
        return self.arrival.request_id

    def is_stopped_by(self, token: int, eos: tuple[int, ...]) -> bool:
        """Its latest token ends it: a stop string, or once ``min_tokens`` are out, EOS
        (any of the model's ``eos`` ids, unless ``ignore_eos``) or one of its
        ``stop_token_ids``."""
        arrival = self.arrival
        if self.is_stop_matched:
            return True
        if len(self.output_ids) < arrival.min_tokens:
            return False
        return (token in eos and not arrival.ignore_eos) or token in arrival.stop_token_ids

    def emit(self, event: EngineEvent) -> None:
        if self.loop is None or self.loop.is_closed():  # no client, or the server is gone
            return
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass(frozen=True)
class PassInputs:
    """Everything a pass depends on besides the model's outputs.

    Rank 0 fills it from its clock and inboxes; with N ranks it is broadcast, so every
    rank's scheduler sees bit-identical inputs and makes identical decisions.
    ``prev_end`` is when the previous pass's model step ended (its postprocess time).
    """

    now: float
    prev_end: float | None
    arrivals: list[Arrival]
    aborts: list[str]
    configs: list[LiveUpdate]
    kv_releases: list[str] = field(default_factory=list)  # held KV blocks to give back
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


class KVEventSink(Protocol):
    """Where each pass's prefix-cache events go (the worker's KV event publisher), with a
    way to read a still-resident request's tokens (a stored block's token ids)."""

    def publish(self, events: Sequence[KVEvent], tokens_of: Callable[[str], list[int]]) -> None: ...


class EngineObserver(Protocol):
    """Sees every plan and every finished request (tests of rank identity record them)."""

    def on_plan(self, plan: GenPlan) -> None: ...

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None: ...


@dataclass(frozen=True)
class EngineSnapshot:
    """Published after every pass. ``stat`` is the latest periodic stat line, or a
    since-start line before the first period."""

    stats: SchedulerStats
    stat: StatLine
    config: dict[str, Any]
    inflight: int
    tokens_total: int
    passes: int
    recent: tuple[StatLine, ...] = ()  # the last periodic lines, oldest first
    spec_decode: SpecDecodeCounts | None = None  # drafts and acceptances (None: not speculating)

    @property
    def recent_lines(self) -> str:
        """``GET /statlines``: the recent periodic lines, oldest first, one per line."""
        return "".join(format_statline(line) + "\n" for line in self.recent)

    @property
    def stat_line(self) -> str:
        return format_statline(self.stat)
