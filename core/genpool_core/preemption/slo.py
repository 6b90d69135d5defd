"""``target_output_tps``: T is a per-request output-rate floor met by >= 1 - eps of requests.

A request may bring its own floor T_i (``GenRequest.target_output_tps``); its span D,
laxity, windows and below-target test use T_i, every other request uses the pool's T.

Victims, in order (docs/design.md#slo-mode): the laxity victim (most laxity, paused until
its laxity is nearly spent), a request already below T (it has nothing left to
lose), or, paid from the credit bucket, a sacrifice. Credit accrues ``eps`` per
keyed completion and is charged 1 per completion below T, so sacrifices spend
exactly the SLO budget that on-target completions leave unused.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from genpool_core.names import PreemptionMode
from genpool_core.preemption.base import PolicyBase
from genpool_core.preemption.pausing import Victim, is_in_hysteresis
from genpool_core.preemption.settings import (
    GenPreemptionSettings,
    ResolvedCapacity,
)
from genpool_core.request import GenRequest, VictimKind
from genpool_core.stats import SloModeStats


class TargetOutputTpsPolicy(PolicyBase):
    mode: ClassVar[PreemptionMode] = PreemptionMode.TARGET_OUTPUT_TPS
    EPS: ClassVar[float] = 0.2
    MIN_LAXITY_FRACTION: ClassVar[float] = 0.02
    RESUME_LAXITY_FRACTION: ClassVar[float] = 0.01
    MAX_LAXITY_PAUSE_FRACTION: ClassVar[float] = 0.35
    WINDOW_FRACTION: ClassVar[float] = 0.15
    MAX_LAXITY_PAUSES: ClassVar[int] = 8
    MAX_BELOW_TARGET_PAUSES: ClassVar[int] = 3
    CREDIT_BOUND: ClassVar[float] = 3000 * 0.2
    RATE_PRIOR_TOKENS: ClassVar[int] = 4
    HYSTERESIS_FRACTION: ClassVar[float] = 0.02
    # Weight of the newest step interval in the step-time EMA (the rate prior).
    STEP_TIME_EMA_WEIGHT: ClassVar[float] = 0.1

    def __init__(self, settings: GenPreemptionSettings, capacity: ResolvedCapacity) -> None:
        super().__init__(settings, capacity)
        assert settings.target_output_tps is not None
        self.target_tps = settings.target_output_tps
        self.credit = 0.0
        self.step_time_s: float | None = None
        self._batch: dict[int, _Member] = {}  # batch order (entry order)

    # -- the request's SLO clock ---------------------------------------------------

    def floor(self, request: GenRequest) -> float:
        """The request's output-rate floor: its own T_i, else the pool's T."""
        own = request.target_output_tps
        return own if own is not None else self.target_tps

    def decode_span(self, request: GenRequest) -> float:
        """D = (max_tokens - 1) / T_i: the decode span the request's floor allows."""
        return (request.max_tokens - 1) / self.floor(request)

    def prior_rate(self) -> float | None:
        """Tokens/s of a request without history: 1 / the recent step time (``None``:
        no step yet, each request's own floor is its prior)."""
        return 1.0 / self.step_time_s if self.step_time_s is not None else None

    def laxity(self, request: GenRequest, now: float) -> float:
        """L = first_token_time + (max_tokens - 1)/T_i - (now + remaining / r)."""
        return self._laxity(request, now, self.decode_span(request), self.prior_rate())

    def _laxity(self, request: GenRequest, now: float, span: float, prior: float | None) -> float:
        """:meth:`laxity` given D and the prior (the victim scan computes them once).

        ``r`` is the request's own unpaused rate once it has ``RATE_PRIOR_TOKENS``
        tokens here, else ``prior`` (its floor before the first step).
        ``num_gen_tokens`` and ``num_remaining_tokens`` are spelled out: this runs for
        every batch member of a pass that takes a victim, and two property calls per
        member are a tenth of that pass.
        """
        unpaused = request.unpaused_time(now)
        generated = request.num_output_tokens - request.tokens_at_admission
        if generated >= self.RATE_PRIOR_TOKENS and unpaused > 0.0:
            rate = generated / unpaused
        elif prior is not None:
            rate = prior
        else:
            rate = self.floor(request)
        finish_at = now + (request.max_tokens - request.num_output_tokens) / rate
        return request.output_start_time() + span - finish_at

    def on_step_time(self, seconds: float) -> None:
        if seconds <= 0.0:
            return
        if self.step_time_s is None:
            self.step_time_s = seconds
        else:
            w = self.STEP_TIME_EMA_WEIGHT
            self.step_time_s = (1.0 - w) * self.step_time_s + w * seconds

    def is_in_hysteresis(self, request: GenRequest, now: float) -> bool:
        """The shared token hysteresis, or less than a fraction of its span since it
        (re)entered the batch."""
        min_run_s = self.HYSTERESIS_FRACTION * self.decode_span(request)
        return is_in_hysteresis(request, now, min_run_s)

    # -- victims -------------------------------------------------------------------

    def on_batch_enter(self, request: GenRequest) -> None:
        span = self.decode_span(request)
        self._batch[id(request)] = _Member(request, span, self.HYSTERESIS_FRACTION * span)

    def on_batch_leave(self, request: GenRequest) -> None:
        del self._batch[id(request)]

    def choose_victims(self, now: float) -> Iterator[Victim]:
        """Laxity victims (most laxity first), then below-target, then sacrifices.

        A generator: the batch is scanned at the first ``next``, and only then (most
        passes under overload take no victim: the paused cap is reached).
        """
        yield from self._ranked(now, *self._candidates(now))

    def _candidates(
        self, now: float
    ) -> tuple[list[tuple[float, int, GenRequest]], list[GenRequest], list[GenRequest]]:
        """One scan of the batch: laxity candidates, below-target ones, sacrificeable ones."""
        laxity: list[tuple[float, int, GenRequest]] = []
        below: list[GenRequest] = []
        sacrifices: list[GenRequest] = []
        prior = self.prior_rate()  # once per pass
        min_laxity_fraction = self.MIN_LAXITY_FRACTION
        max_laxity_pauses = self.MAX_LAXITY_PAUSES
        max_below_pauses = self.MAX_BELOW_TARGET_PAUSES
        for order, member in enumerate(list(self._batch.values())):
            request, span = member.request, member.span
            if not member.is_past_hysteresis:
                if span <= 0.0 or is_in_hysteresis(request, now, member.min_run_s):
                    continue
                member.is_past_hysteresis = True  # for the rest of this run
            lax = self._laxity(request, now, span, prior)
            pauses = request.num_pauses
            if lax >= min_laxity_fraction * span and pauses < max_laxity_pauses:
                laxity.append((-lax, order, request))
            if request.is_sacrificed:
                if pauses < max_below_pauses:
                    below.append(request)
            else:
                if lax < 0.0 and pauses < max_below_pauses:
                    below.append(request)
                sacrifices.append(request)
        return laxity, below, sacrifices

    def _ranked(
        self,
        now: float,
        laxity: list[tuple[float, int, GenRequest]],
        below: list[GenRequest],
        sacrifices: list[GenRequest],
    ) -> Iterator[Victim]:
        chosen: set[int] = set()
        # Most laxity, then batch order ((-L, order) is unique); a heap, as a pass
        # takes a few victims of up to a batch of candidates.
        heapq.heapify(laxity)
        while laxity:
            negative_lax, _, request = heapq.heappop(laxity)
            span = self.decode_span(request)
            lax = -negative_lax
            hold = min(
                lax - self.RESUME_LAXITY_FRACTION * span, self.MAX_LAXITY_PAUSE_FRACTION * span
            )
            chosen.add(id(request))
            yield Victim(request, VictimKind.LAXITY, now + hold, laxity=lax)
        for request in _longest_resident_first(below):
            if id(request) not in chosen:
                chosen.add(id(request))
                due = now + self.WINDOW_FRACTION * self.decode_span(request)
                yield Victim(request, VictimKind.BELOW_TARGET, due)
        for request in _longest_resident_first(sacrifices):
            # Re-read the credit: pausing a sacrifice spends it before the next one.
            if id(request) not in chosen and self.credit >= 1.0:
                chosen.add(id(request))
                due = now + self.WINDOW_FRACTION * self.decode_span(request)
                yield Victim(request, VictimKind.SACRIFICED, due)

    def num_pausable(self, now: float, limit: int) -> int:
        """As the base counts, but sacrifices only as far as the credit pays for them
        (the ranking re-reads the credit, which only a real pause spends)."""
        count, sacrifices = 0, 0
        for victim in self.choose_victims(now):
            if count >= limit:
                break
            if victim.kind is VictimKind.SACRIFICED:
                if sacrifices + 1 > self.credit:
                    break
                sacrifices += 1
            count += 1
        return count

    def on_pause(self, victim: Victim) -> None:
        if victim.kind is VictimKind.SACRIFICED:
            victim.request.is_sacrificed = True
            self.credit -= 1.0

    # -- credit --------------------------------------------------------------------

    def is_below_target(self, request: GenRequest) -> bool:
        return request.is_below_floor(self.floor(request))

    def on_complete(self, request: GenRequest, now: float) -> bool | None:
        if not request.is_slo_counted:
            return None
        below = self.is_below_target(request)
        credit = self.credit + self.EPS - float(below) + float(request.is_sacrificed)
        self.credit = min(self.CREDIT_BOUND, max(-self.CREDIT_BOUND, credit))
        return below

    # -- reporting -----------------------------------------------------------------

    def mode_knobs(self) -> dict[str, object]:
        return {"target_output_tps": self.target_tps}

    def constants(self) -> dict[str, object]:
        return {
            **super().constants(),
            "eps": self.EPS,
            "min_laxity_fraction": self.MIN_LAXITY_FRACTION,
            "resume_laxity_fraction": self.RESUME_LAXITY_FRACTION,
            "max_laxity_pause_fraction": self.MAX_LAXITY_PAUSE_FRACTION,
            "window_fraction": self.WINDOW_FRACTION,
            "max_laxity_pauses": self.MAX_LAXITY_PAUSES,
            "max_below_target_pauses": self.MAX_BELOW_TARGET_PAUSES,
            "credit_bound": self.CREDIT_BOUND,
            "hysteresis_fraction": self.HYSTERESIS_FRACTION,
        }

    def mode_stats(self, now: float, paused: Iterable[GenRequest]) -> SloModeStats:
        paused_below = sum(
            1 for r in paused if r.is_sacrificed or r.victim_kind is VictimKind.BELOW_TARGET
        )
        return SloModeStats(credit=self.credit, paused_below_target=paused_below)


@dataclass(slots=True)
class _Member:
    """A batch member and what stays fixed while it runs: D, the minimum run
    (``HYSTERESIS_FRACTION * D``), and, once seen, that its hysteresis is over
    (tokens and time since its run started only grow)."""

    request: GenRequest
    span: float
    min_run_s: float
    is_past_hysteresis: bool = False


def _longest_resident_first(requests: list[GenRequest]) -> list[GenRequest]:
    """Earliest ``resident_since`` first; the sort is stable, so ties keep batch order."""
    return sorted(requests, key=lambda r: r.resident_since or 0.0)
