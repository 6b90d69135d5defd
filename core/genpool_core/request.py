"""The per-request state of one GEN request: lifecycle, tokens and pause bookkeeping.

One object per request, shared by the admission queue, the slot pool, the preemption
policy and the scheduler. Times are seconds on the pass clock (``now`` passed in);
nothing here reads a clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from genpool_core.block_hash import BlockHash


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    ACTIVE = "active"
    PAUSED = "paused"
    FINISHED = "finished"


class VictimKind(enum.Enum):
    """Why a request was paused (stat line key in ``victims=``)."""

    LAXITY = "laxity"
    BELOW_TARGET = "below_target"
    SACRIFICED = "sacrificed"
    WAIT = "wait"


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


def is_valid_time(value: float) -> bool:
    """A pass-clock time: finite and not negative."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0.0


def is_positive_number(value: object) -> bool:
    """A per-request SLO value: a finite number above zero (not a bool)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0.0
    )


@dataclass(eq=False, slots=True)
class GenRequest:
    """A request waiting for, or holding, a GEN slot.

    ``num_output_tokens`` counts every output token produced so far, the first one
    included (in a disaggregated pool the context server produced it, hence the
    default 1; a worker doing its own prefill starts at 0). ``max_tokens`` is the
    total output length, so ``max_tokens - num_output_tokens`` tokens remain.
    ``arrival_time`` is when the request reached this GEN worker; ``None`` makes it
    unkeyed (warm-up, probes): it never triggers pauses and is not in SLO stats.
    ``slo_ttft_s`` (D_i) and ``target_output_tps`` (T_i) are this request's own
    admission target and output-rate floor; ``None`` uses the pool's (X and T).
    ``holds_kv_at_finish``: a prefill tier's request whose KV another worker will pull
    (docs/pd.md): when it ends (not aborted) its blocks stay held until released.
    ``block_hashes``: the prefix-cache hashes of its full blocks of tokens
    (genpool_core.block_hash), prompt first; whoever owns the tokens (the worker, the
    simulator's workload) appends output blocks' hashes as they fill. Empty: nothing
    of it is shared.
    """

    request_id: str
    prompt_len: int
    max_tokens: int
    arrival_time: float | None = None
    first_token_time: float | None = None
    num_output_tokens: int = 1
    slo_ttft_s: float | None = None
    target_output_tps: float | None = None
    holds_kv_at_finish: bool = False
    block_hashes: list[BlockHash] = field(default_factory=list)

    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None
    blocks: tuple[int, ...] = ()  # KV blocks held from admission (genpool_core.kv_account)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    # Speculative decoding: drafts proposed for its next step (kept while it is paused).
    draft_token_ids: tuple[int, ...] = ()
    resident_since: float | None = None
    tokens_at_admission: int = 0
    first_gen_token_time: float | None = None
    last_token_time: float | None = None
    is_slo_counted: bool = False
    finish_reason: FinishReason | None = None

    num_pauses: int = 0
    paused_since: float | None = None
    resume_due: float | None = None
    victim_kind: VictimKind | None = None
    is_sacrificed: bool = False
    unpaused_decode_time: float = 0.0
    paused_time: float = 0.0
    active_since: float | None = None
    run_started_at: float | None = None
    tokens_at_run_start: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field of an incoming request."""
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError("request_id must be a non-empty string")
        for name in ("prompt_len", "max_tokens", "num_output_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.num_output_tokens >= self.max_tokens:
            raise ValueError(
                f"num_output_tokens={self.num_output_tokens} leaves nothing to decode "
                f"(max_tokens={self.max_tokens})"
            )
        for name in ("arrival_time", "first_token_time"):
            value = getattr(self, name)
            if value is not None and not is_valid_time(value):
                raise ValueError(f"{name} must be a finite time >= 0, got {value!r}")
        for name in ("slo_ttft_s", "target_output_tps"):
            value = getattr(self, name)
            if value is not None and not is_positive_number(value):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")

    @property
    def is_keyed(self) -> bool:
        return self.arrival_time is not None

    @property
    def has_own_slo(self) -> bool:
        """It brought its own D_i or T_i: counted in SLO stats without waiting for X's
        warm-up (its targets do not depend on X)."""
        return self.slo_ttft_s is not None or self.target_output_tps is not None

    def is_below_floor(self, floor: float) -> bool:
        """Its realised output rate is under ``floor`` (undefined rates are not)."""
        rate = self.realised_output_rate()
        return rate is not None and rate < floor

    @property
    def num_remaining_tokens(self) -> int:
        return self.max_tokens - self.num_output_tokens

    @property
    def num_gen_tokens(self) -> int:
        """Tokens this worker has decoded for the request."""
        return self.num_output_tokens - self.tokens_at_admission

    def unpaused_time(self, now: float) -> float:
        """Seconds spent in the batch since admission (the open interval included)."""
        if self.status is RequestStatus.ACTIVE and self.active_since is not None:
            return self.unpaused_decode_time + (now - self.active_since)
        return self.unpaused_decode_time

    def output_start_time(self) -> float:
        """Start of the SLO rate clock: the first token, else admission."""
        if self.first_token_time is not None:
            return self.first_token_time
        return self.resident_since if self.resident_since is not None else 0.0

    def realised_output_rate(self) -> float | None:
        """``(n - 1) / (t_last - first_token_time)``; ``None`` when undefined."""
        if self.num_output_tokens < 2 or self.last_token_time is None:
            return None
        span = self.last_token_time - self.output_start_time()
        if span <= 0.0:
            return math.inf
        return (self.num_output_tokens - 1) / span
