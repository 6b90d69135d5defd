"""``tpot_budget``: each request may have its TPOT inflated by at most ``b`` (relative).

A wait victim is an active request whose pause budget ``b * unpaused - paused`` still
covers a whole window; the one with the most budget left is paused for one window w.
While a request runs, its budget left is ``b * now + c`` with ``c`` fixed for the run,
so the batch is kept ordered by ``c`` across passes and a pass evaluates only the
head of that order (:class:`BudgetOrder`), not the whole batch.

Window law (once per stat period, only when paused requests completed in it):
``w <- clamp(w * clamp((b / m) ** GAIN, 1/MAX_STEP, MAX_STEP), MIN_WINDOW_S, MAX_WINDOW_S)``
where ``m`` is the mean realised inflation ``paused / unpaused`` of those requests.
Victims that ended well under budget lengthen the window (fewer, longer pauses use
their budget); overshoot shortens it. Bounded steps and bounds keep it stable.

A request with its own output-rate floor T_i (``GenRequest.target_output_tps``) is
counted against it at completion (the stat line's ``below_target``), and it is a wait
victim only while its realised rate would still meet T_i after one more window's
pause (:func:`keeps_floor_through`): the budget bounds everyone's inflation, the floor
protects the requests that asked for one. Requests without T_i are not counted.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator
from typing import ClassVar

from genpool_core.names import PreemptionMode
from genpool_core.preemption.base import PolicyBase
from genpool_core.preemption.pausing import Victim, is_in_hysteresis
from genpool_core.preemption.settings import (
    GenPreemptionSettings,
    ResolvedCapacity,
)
from genpool_core.request import GenRequest, VictimKind
from genpool_core.stats import TpotModeStats


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
        self._order = BudgetOrder(self.budget)

    def budget_left(self, request: GenRequest, now: float) -> float:
        return self.budget * request.unpaused_time(now) - request.paused_time

    def on_batch_enter(self, request: GenRequest) -> None:
        self._order.add(request)

    def on_batch_leave(self, request: GenRequest) -> None:
        self._order.remove(request)

    def choose_victims(self, now: float) -> Iterator[Victim]:
        """Most budget left first (at least one window of it), ties in batch order."""
        due = now + self.window_s
        for request in self._order.ranked(now, self.window_s, self.max_pauses):
            yield Victim(request, VictimKind.WAIT, due)

    def on_complete(self, request: GenRequest, now: float) -> bool | None:
        if request.num_pauses > 0 and request.unpaused_decode_time > 0.0:
            self._period_inflation_sum += request.paused_time / request.unpaused_decode_time
            self._period_victims += 1
        return super().on_complete(request, now)  # counted only against an own T_i

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

    def mode_stats(self, now: float, paused: Iterable[GenRequest]) -> TpotModeStats:
        return TpotModeStats(
            budget=self.budget, window_s=self.window_s, inflation=self.last_inflation
        )


class BudgetOrder:
    """The batch ordered by the part of the budget left that is fixed while it runs.

    For a running request ``budget_left(now) = b * (unpaused + now - active_since) -
    paused = b * now + c`` with ``c = b * (unpaused - active_since) - paused`` fixed
    until it leaves the batch. Entries are kept sorted by ``(-c, entry number)``
    (entry number = batch order), so the request with the most budget left is near the
    head every pass. :meth:`ranked` computes the exact ``budget_left`` (the arithmetic
    of :meth:`TpotBudgetPolicy.budget_left`) of head entries only, and takes one as
    the next victim once no entry further down can reach it: ``b * now + c`` and the
    exact value differ by rounding only, far less than :data:`RELATIVE_MARGIN`.
    """

    RELATIVE_MARGIN = 1e-9

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._entries: list[tuple[float, int, GenRequest]] = []
        self._by_request: dict[int, tuple[float, int, GenRequest]] = {}
        self._num_entered = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, request: GenRequest) -> None:
        assert request.active_since is not None, "only a running request joins the batch"
        self._num_entered += 1
        fixed = self.budget * (request.unpaused_decode_time - request.active_since)
        entry = (-(fixed - request.paused_time), self._num_entered, request)
        self._by_request[id(request)] = entry
        bisect.insort(self._entries, entry)  # (-c, entry number) is unique

    def remove(self, request: GenRequest) -> None:
        entry = self._by_request.pop(id(request))
        position = bisect.bisect_left(self._entries, entry[:2])
        assert self._entries[position][2] is request
        del self._entries[position]

    def ranked(self, now: float, window_s: float, max_pauses: int) -> Iterator[GenRequest]:
        """Requests with at least ``window_s`` of budget left, most first, ties in batch
        order; not paused ``max_pauses`` times yet, not in hysteresis. Lazy."""
        entries = list(self._entries)  # joiners during the pass are in hysteresis anyway
        base = self.budget * now
        frontier: list[tuple[float, int, GenRequest]] = []  # exact (-left, number, request)
        position = 0
        while True:
            while position < len(entries):
                negative_fixed, number, request = entries[position]
                bound = base - negative_fixed
                bound += self.RELATIVE_MARGIN * (1.0 + abs(base) + abs(negative_fixed))
                if bound < window_s:  # nobody from here down has a window of budget
                    position = len(entries)
                    break
                if frontier and bound < -frontier[0][0]:
                    break  # the frontier's best beats everyone not yet evaluated
                position += 1
                if request.num_pauses >= max_pauses or is_in_hysteresis(request, now):
                    continue
                if not keeps_floor_through(request, now, window_s):
                    continue
                left = self.budget * request.unpaused_time(now) - request.paused_time
                if left >= window_s:
                    heapq.heappush(frontier, (-left, number, request))
            if not frontier:
                return
            yield heapq.heappop(frontier)[2]


def keeps_floor_through(request: GenRequest, now: float, window_s: float) -> bool:
    """Whether ``request`` may pause for ``window_s``: always without its own floor;
    with T_i, only if ``(n - 1) / (now + window_s - first token time) >= T_i``."""
    floor = request.target_output_tps
    if floor is None:
        return True
    span = now + window_s - request.output_start_time()
    num_intervals = request.num_output_tokens - 1
    return num_intervals > 0 and span > 0.0 and num_intervals / span >= floor
