"""``tpot_budget``: each request may have its TPOT inflated by at most ``b`` (relative).

A wait victim is an active request whose pause budget ``b * unpaused - paused`` still
covers a whole window; the one with the most budget left is paused for one window w.

Window law (once per stat period, only when paused requests completed in it):
``w <- clamp(w * clamp((b / m) ** GAIN, 1/MAX_STEP, MAX_STEP), MIN_WINDOW_S, MAX_WINDOW_S)``
where ``m`` is the mean realised inflation ``paused / unpaused`` of those requests.
Victims that ended well under budget lengthen the window (fewer, longer pauses use
their budget); overshoot shortens it. Bounded steps and bounds keep it stable.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar

from genpool_core.preemption.base import PolicyBase
from genpool_core.preemption.pausing import Victim, is_in_hysteresis
from genpool_core.preemption.settings import (
    GenPreemptionSettings,
    PreemptionMode,
    ResolvedCapacity,
)
from genpool_core.request import GenRequest, VictimKind


class TpotBudgetPolicy(PolicyBase):
    mode: ClassVar[PreemptionMode] = PreemptionMode.TPOT_BUDGET
    INITIAL_WINDOW_S: ClassVar[float] = 0.25
    MIN_WINDOW_S: ClassVar[float] = 0.02
    MAX_WINDOW_S: ClassVar[float] = 5.0
    WINDOW_GAIN: ClassVar[float] = 0.5
    MAX_WINDOW_STEP: ClassVar[float] = 2.0
    MIN_INFLATION: ClassVar[float] = 1e-6

    def __init__(self, settings: GenPreemptionSettings, capacity: ResolvedCapacity) -> None:
        super().__init__(settings, capacity)
        assert settings.tpot_budget is not None
        self.budget = settings.tpot_budget
        self.max_pauses = settings.max_pauses_per_request
        self.window_s = self.INITIAL_WINDOW_S
        self._period_inflation_sum = 0.0
        self._period_victims = 0
        self.last_inflation: float | None = None

    def budget_left(self, request: GenRequest, now: float) -> float:
        return self.budget * request.unpaused_time(now) - request.paused_time

    def choose_victims(self, active: Sequence[GenRequest], now: float) -> Iterator[Victim]:
        """Most budget left first (at least one window of it)."""
        ranked: list[tuple[float, int, GenRequest]] = []
        for order, request in enumerate(active):
            if request.num_pauses >= self.max_pauses or is_in_hysteresis(request, now):
                continue
            left = self.budget_left(request, now)
            if left >= self.window_s:
                ranked.append((-left, order, request))
        ranked.sort(key=lambda entry: (entry[0], entry[1]))
        due = now + self.window_s
        return (Victim(request, VictimKind.WAIT, due) for _, _, request in ranked)

    def on_complete(self, request: GenRequest, now: float) -> bool | None:
        if request.num_pauses > 0 and request.unpaused_decode_time > 0.0:
            self._period_inflation_sum += request.paused_time / request.unpaused_decode_time
            self._period_victims += 1
        return None  # no output-rate target in this mode

    def on_stat_period(self, now: float) -> None:
        if self._period_victims == 0:
            return
        mean = self._period_inflation_sum / self._period_victims
        self.last_inflation = mean
        factor = (self.budget / max(mean, self.MIN_INFLATION)) ** self.WINDOW_GAIN
        factor = min(self.MAX_WINDOW_STEP, max(1.0 / self.MAX_WINDOW_STEP, factor))
        self.window_s = min(self.MAX_WINDOW_S, max(self.MIN_WINDOW_S, self.window_s * factor))
        self._period_inflation_sum = 0.0
        self._period_victims = 0

    def mode_knobs(self) -> dict[str, object]:
        return {"tpot_budget": self.budget, "max_pauses_per_request": self.max_pauses}

    def constants(self) -> dict[str, object]:
        return {
            **super().constants(),
            "initial_window_s": self.INITIAL_WINDOW_S,
            "window_s_bounds": f"[{self.MIN_WINDOW_S},{self.MAX_WINDOW_S}]",
            "window_gain": self.WINDOW_GAIN,
            "max_window_step": self.MAX_WINDOW_STEP,
        }

    def stat_fields(self, now: float, paused: Iterable[GenRequest]) -> dict[str, object]:
        fields: dict[str, object] = {"budget": self.budget, "window": self.window_s}
        if self.last_inflation is not None:
            fields["inflation"] = self.last_inflation
        return fields
