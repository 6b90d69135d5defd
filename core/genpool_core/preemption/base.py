"""What the scheduler asks of a preemption policy, and the ``off`` policy.

A policy ranks victims among the batch it is told about (:meth:`on_batch_enter` /
:meth:`on_batch_leave`, so a ranking can be kept across passes instead of rebuilt),
without mutating anything (:meth:`choose_victims`), and reacts to events (a pause it
chose, a completion, a step time, a stat period); the
pausing itself is :class:`genpool_core.preemption.pausing.PauseLane`, the knobs
(how many may be paused) are the scheduler's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import ClassVar, Protocol

from genpool_core.names import PreemptionMode
from genpool_core.preemption.pausing import HYSTERESIS_TOKENS, Victim
from genpool_core.preemption.settings import (
    GenPreemptionSettings,
    ResolvedCapacity,
)
from genpool_core.request import GenRequest
from genpool_core.stats import ModeStats


class PreemptionPolicy(Protocol):
    """The scheduler's view of a policy."""

    @property
    def mode(self) -> PreemptionMode: ...

    @property
    def settings(self) -> GenPreemptionSettings: ...

    @property
    def capacity(self) -> ResolvedCapacity: ...

    def on_batch_enter(self, request: GenRequest) -> None:
        """``request`` joined the end of the batch (admitted or resumed; its run started)."""
        ...

    def on_batch_leave(self, request: GenRequest) -> None:
        """``request`` left the batch (paused, finished or aborted)."""
        ...

    def choose_victims(self, now: float) -> Iterator[Victim]:
        """Batch members in the order the policy would pause them.

        Pausing one request does not change another's standing at the same ``now``,
        so one ranking per pass gives what repeated single choices would. Lazy: work
        starts at the first ``next``; the scheduler stops taking victims when the head
        is no longer at risk, and a yielded victim is always paused (then
        :meth:`on_pause` and :meth:`on_batch_leave` are called). Requests that join
        the batch during the pass are never yielded (they are in hysteresis).
        """
        ...

    def on_pause(self, victim: Victim) -> None:
        """The scheduler paused ``victim`` (before it asks for the next one)."""
        ...

    def num_pausable(self, now: float, limit: int) -> int:
        """How many batch members (at most ``limit``) the policy would pause now, one
        after another; mutates nothing (the pause budget of the stat line)."""
        ...

    def on_step_time(self, seconds: float) -> None:
        """A decode step of a non-empty batch took ``seconds``."""
        ...

    def on_complete(self, request: GenRequest, now: float) -> bool | None:
        """A resident finished (not aborted). Returns whether it ended below the SLO
        target, or ``None`` when it is not counted against one."""
        ...

    def on_stat_period(self, now: float) -> None:
        """Called once per stat interval, after the stat line's snapshot."""
        ...

    def mode_stats(self, now: float, paused: Iterable[GenRequest]) -> ModeStats:
        """The mode's own gauges (stat line, metrics); ``None`` for a mode without any."""
        ...

    def enabled_line(self) -> str:
        """The one start-up line listing every knob and constant in force."""
        ...


class PolicyBase:
    """No-op reactions and the start-up line; the modes override what they use."""

    mode: ClassVar[PreemptionMode]

    def __init__(self, settings: GenPreemptionSettings, capacity: ResolvedCapacity) -> None:
        self.settings = settings
        self.capacity = capacity

    def on_batch_enter(self, request: GenRequest) -> None:
        return None

    def on_batch_leave(self, request: GenRequest) -> None:
        return None

    def choose_victims(self, now: float) -> Iterator[Victim]:
        return iter(())

    def num_pausable(self, now: float, limit: int) -> int:
        return sum(1 for _ in itertools.islice(self.choose_victims(now), max(0, limit)))

    def choose_victim(self, now: float) -> Victim | None:
        """The first of :meth:`choose_victims` (tests and tools)."""
        return next(self.choose_victims(now), None)

    def on_pause(self, victim: Victim) -> None:
        return None

    def on_step_time(self, seconds: float) -> None:
        return None

    def on_complete(self, request: GenRequest, now: float) -> bool | None:
        """Modes without a pool floor count only requests that bring their own T_i."""
        if not request.is_slo_counted or request.target_output_tps is None:
            return None
        return request.is_below_floor(request.target_output_tps)

    def on_stat_period(self, now: float) -> None:
        return None

    def mode_stats(self, now: float, paused: Iterable[GenRequest]) -> ModeStats:
        return None

    def mode_knobs(self) -> dict[str, object]:
        return {}

    def constants(self) -> dict[str, object]:
        return {"hysteresis_tokens": HYSTERESIS_TOKENS}

    def enabled_line(self) -> str:
        if self.mode is PreemptionMode.OFF:
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


class OffPolicy(PolicyBase):
    """Preemption off: nothing is ever a victim."""

    mode: ClassVar[PreemptionMode] = PreemptionMode.OFF
