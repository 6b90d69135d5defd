"""A simulated GEN replica (its scheduler, pass state and lifecycle) and the timed
callbacks of the simulator's event heap."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from genpool_core.plan import GenPlan
from genpool_core.scheduler import GenScheduler


@dataclass(frozen=True, slots=True)
class Tick:
    """A callback at a simulated time, after every request event due at that time."""

    callback: Callable[[float], None]
    order: int = 0  # among ticks at the same time: lower first


@dataclass(eq=False)
class GenWorker:
    index: int
    scheduler: GenScheduler
    plan: GenPlan | None = None
    is_busy: bool = False
    recompute_tokens: dict[str, int] = field(default_factory=dict)
    # Tokens each drafting member of ``plan`` emits (speculative decoding; others emit 1).
    emitted: dict[str, int] = field(default_factory=dict)
    drafted: dict[str, int] = field(default_factory=dict)  # and the drafts each verified
    started_at: float = 0.0  # replica-seconds count from here (start-up included)
    is_ready: bool = True  # serving: it has loaded its model
    is_draining: bool = False  # removed: admits nothing new, finishes its residents
    retired_at: float | None = None

    @property
    def is_routable(self) -> bool:
        return self.is_ready and not self.is_draining

    @property
    def is_serving(self) -> bool:
        """Ready and not yet retired: it reports stat lines."""
        return self.is_ready and self.retired_at is None

    def seconds_within(self, start: float, end: float) -> float:
        """Its replica time inside [start, end]: start-up and draining count."""
        stop = end if self.retired_at is None else min(self.retired_at, end)
        return max(0.0, stop - max(self.started_at, start))

    @property
    def load(self) -> int:
        return self.scheduler.num_residents + self.scheduler.num_waiting
