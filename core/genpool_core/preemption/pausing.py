"""The pause/resume mechanism every preemption mode shares, in one place.

A policy only ranks victims and reacts to events; :class:`PauseLane` (owned by the
scheduler) does the pausing and resuming: the per-request pause bookkeeping, the
resume lane ordered by due time, and the counters behind the stat line.
:func:`is_in_hysteresis` is the one definition of "too recently (re)started to pause".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from genpool_core.preemption.lane import ResumeLane
from genpool_core.request import GenRequest, RequestStatus, VictimKind

# A request entering the batch (admitted or resumed) runs at least this many tokens
# before it can be paused (post-resume hysteresis; no pause-on-admit).
HYSTERESIS_TOKENS = 4


def is_in_hysteresis(request: GenRequest, now: float, min_run_s: float = 0.0) -> bool:
    """Fewer than ``HYSTERESIS_TOKENS`` tokens, or less than ``min_run_s``, since it
    (re)entered the batch."""
    if request.num_output_tokens - request.tokens_at_run_start < HYSTERESIS_TOKENS:
        return True
    started = request.run_started_at
    return started is not None and now - started < min_run_s


@dataclass(frozen=True, slots=True)
class Victim:
    """A policy's choice: pause ``request`` until ``resume_due`` at the latest."""

    request: GenRequest
    kind: VictimKind
    resume_due: float
    laxity: float | None = None


@dataclass(slots=True)
class PreemptionCounters:
    """Cumulative since start; the stat line takes window deltas."""

    pauses: int = 0
    victims: dict[str, int] = field(default_factory=dict)
    laxity_sum: float = 0.0
    laxity_resumes: int = 0
    forced_resumes: int = 0
    slo_completed: int = 0
    below_target: int = 0


class PauseLane:
    """Paused requests (earliest due first) and the state changes of pausing.

    ``start_run`` / ``pause`` / ``resume`` / ``release`` are the only places a
    resident's status and its paused/unpaused time accounting change.
    """

    def __init__(self) -> None:
        self._lane = ResumeLane()
        self.counters = PreemptionCounters()

    def __len__(self) -> int:
        return len(self._lane)

    def __iter__(self) -> Iterator[GenRequest]:
        """Paused requests in resume order (earliest due first)."""
        return iter(self._lane)

    def peek(self) -> GenRequest | None:
        return self._lane.peek()

    def is_head_due(self, now: float) -> bool:
        return self._lane.is_head_due(now)

    def start_run(self, request: GenRequest, now: float) -> None:
        """The request enters the batch (admission or resume)."""
        request.status = RequestStatus.ACTIVE
        request.active_since = now
        request.run_started_at = now
        request.tokens_at_run_start = request.num_output_tokens

    def pause(self, victim: Victim, now: float) -> None:
        request = victim.request
        if request.status is not RequestStatus.ACTIVE:
            raise ValueError(f"cannot pause {request.request_id!r}: it is {request.status.value}")
        request.unpaused_decode_time = request.unpaused_time(now)
        request.active_since = None
        request.status = RequestStatus.PAUSED
        request.num_pauses += 1
        request.paused_since = now
        request.resume_due = victim.resume_due
        request.victim_kind = victim.kind
        self._lane.push(request, victim.resume_due)
        counters = self.counters
        counters.pauses += 1
        kind = victim.kind.value
        counters.victims[kind] = counters.victims.get(kind, 0) + 1
        if victim.laxity is not None:
            counters.laxity_sum += victim.laxity

    def resume(self, request: GenRequest, now: float) -> None:
        """Put a paused request back in the batch; it is forced when its due time passed."""
        self._leave_pause(request, now)
        if request.resume_due is not None and request.resume_due <= now:
            self.counters.forced_resumes += 1
        if request.victim_kind is VictimKind.LAXITY:
            self.counters.laxity_resumes += 1
        request.resume_due = None
        self.start_run(request, now)

    def release(self, request: GenRequest, now: float) -> None:
        """Account the end of a resident's life (finished or aborted)."""
        if request.status is RequestStatus.PAUSED:
            self._leave_pause(request, now)
        else:
            request.unpaused_decode_time = request.unpaused_time(now)
            request.active_since = None

    def count_completion(self, is_below_target: bool) -> None:
        """An SLO-counted completion (target_output_tps), below the target or not."""
        self.counters.slo_completed += 1
        self.counters.below_target += int(is_below_target)

    def _leave_pause(self, request: GenRequest, now: float) -> None:
        self._lane.remove(request)
        assert request.paused_since is not None
        request.paused_time += now - request.paused_since
        request.paused_since = None
