"""Shared pause/resume bookkeeping of every preemption policy (docs/design.md#shared-bookkeeping).

A policy only chooses victims (:meth:`PreemptionPolicy.choose_victim`, no mutation)
and reacts to completions; pausing, resuming, the resume lane, hysteresis and the
counters behind the stat line live here, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from genpool_core.preemption.lane import ResumeLane
from genpool_core.preemption.settings import (
    GenPreemptionSettings,
    PreemptionMode,
    ResolvedCapacity,
)
from genpool_core.request import GenRequest, RequestStatus, VictimKind


@dataclass(frozen=True, slots=True)
class Victim:
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


class PreemptionPolicy:
    """The ``off`` policy, and the base of the two real ones."""

    mode: ClassVar[PreemptionMode] = PreemptionMode.OFF
    # A request entering the batch (admitted or resumed) runs at least this many
    # tokens before it can be paused (post-resume hysteresis; no pause-on-admit).
    HYSTERESIS_TOKENS: ClassVar[int] = 4
    # Weight of the newest step interval in the step-time EMA (rate prior).
    STEP_TIME_EMA_WEIGHT: ClassVar[float] = 0.1

    def __init__(self, settings: GenPreemptionSettings, capacity: ResolvedCapacity) -> None:
        self.settings = settings
        self.capacity = capacity
        self.paused_cap = capacity.paused_cap
        self.lane = ResumeLane()
        self.counters = PreemptionCounters()
        self.step_time_s: float | None = None

    @property
    def is_enabled(self) -> bool:
        return self.mode is not PreemptionMode.OFF

    @property
    def num_paused(self) -> int:
        return len(self.lane)

    def can_pause(self) -> bool:
        return self.is_enabled and self.num_paused < self.paused_cap

    # -- policy hooks -------------------------------------------------------------

    def choose_victims(self, active: Iterable[GenRequest], now: float) -> Iterator[Victim]:
        """Victims in the order the policy would pause them, computed in one scan.

        Pausing one request does not change another's standing at the same ``now``,
        so one ranked scan per pass gives what repeated single choices would.
        Lazy: the scheduler stops taking victims when the head is no longer at risk.
        Pure: nothing is mutated until :meth:`pause`.
        """
        return iter(())

    def choose_victim(self, active: Iterable[GenRequest], now: float) -> Victim | None:
        """The next victim (the first of :meth:`choose_victims`)."""
        return next(self.choose_victims(active, now), None)

    def on_complete(self, request: GenRequest, now: float) -> None:
        """A resident finished (not aborted); ``request`` holds its final counts."""

    def on_stat_period(self, now: float) -> None:
        """Called once per stat interval, after the stat line's snapshot."""

    def constants(self) -> dict[str, object]:
        return {"hysteresis_tokens": self.HYSTERESIS_TOKENS}

    def stat_fields(self, now: float, paused: Iterable[GenRequest]) -> dict[str, object]:
        """Mode-specific stat-line fields (gauges)."""
        return {}

    # -- shared bookkeeping -------------------------------------------------------

    def observe_step_time(self, seconds: float) -> None:
        if seconds <= 0.0:
            return
        if self.step_time_s is None:
            self.step_time_s = seconds
        else:
            w = self.STEP_TIME_EMA_WEIGHT
            self.step_time_s = (1.0 - w) * self.step_time_s + w * seconds

    def is_in_hysteresis(self, request: GenRequest, now: float) -> bool:
        return request.num_output_tokens - request.tokens_at_run_start < self.HYSTERESIS_TOKENS

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
        self.lane.push(request, victim.resume_due)
        self.counters.pauses += 1
        kind = victim.kind.value
        self.counters.victims[kind] = self.counters.victims.get(kind, 0) + 1
        if victim.laxity is not None:
            self.counters.laxity_sum += victim.laxity

    def resume(self, request: GenRequest, now: float) -> None:
        """Put a paused request back in the batch; it is forced when its due time passed."""
        self._leave_pause(request, now)
        if request.resume_due is not None and request.resume_due <= now:
            self.counters.forced_resumes += 1
        if request.victim_kind is VictimKind.LAXITY:
            self.counters.laxity_resumes += 1
        request.resume_due = None
        self.start_run(request, now)

    def start_run(self, request: GenRequest, now: float) -> None:
        """The request enters the batch (admission or resume)."""
        request.status = RequestStatus.ACTIVE
        request.active_since = now
        request.run_started_at = now
        request.tokens_at_run_start = request.num_output_tokens

    def release(self, request: GenRequest, now: float) -> None:
        """Account the end of a resident's life (finished or aborted)."""
        if request.status is RequestStatus.PAUSED:
            self._leave_pause(request, now)
        else:
            request.unpaused_decode_time = request.unpaused_time(now)
            request.active_since = None

    def _leave_pause(self, request: GenRequest, now: float) -> None:
        self.lane.remove(request)
        assert request.paused_since is not None
        request.paused_time += now - request.paused_since
        request.paused_since = None

    def enabled_line(self) -> str:
        """The one start-up line listing every knob and constant in force."""
        if not self.is_enabled:
            return "gen_preemption disabled"
        c = self.capacity
        knobs: dict[str, object] = {
            "mode": self.mode.value,
            **self.mode_knobs(),
            "max_batch_size": c.max_batch_size,
            "max_num_active_requests": c.base_resident_capacity,
            "resident_headroom": c.resident_headroom,
            "max_resident_headroom": c.max_resident_headroom,
            "paused_cap": c.paused_cap,
            "slack_s": self.settings.slack_s,
            "per_pass_budget": self.settings.per_pass_budget,
            "admission_target_s": (
                f"[{self.settings.admission_target_min_s},{self.settings.admission_target_max_s}]"
            ),
            **self.constants(),
        }
        return "gen_preemption enabled " + " ".join(f"{k}={v}" for k, v in knobs.items())

    def mode_knobs(self) -> dict[str, object]:
        return {}
