"""The GEN admission queue: waiters whose context is done, and the adaptive target X.

Pop order is guard tier (keyed, older than ``guard_factor * X``, oldest first), then
slack tier (keyed, least slack first), then unkeyed FIFO. With one X for every
waiter, ``slack = X - age`` orders the keyed waiters exactly by arrival time, so the
two keyed tiers are one list sorted by ``arrival_time``: the tier is a label of the
head (stats, tests), not a second data structure.

A waiter with its own admission target D_i (``slo_ttft_s``) has the fixed deadline
``arrival + D_i``; those waiters are a second list sorted by deadline, and the keyed
head is the earlier deadline of the two lists' heads (a pool waiter's deadline is
``arrival + X``, ``x_max`` before warm-up). Least slack first, then, across both.
Only pool waiters' waits feed X: X is the pool's target, D_i is not ours to adapt.
Without per-request targets the second list is empty and nothing above changes.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections import deque

from genpool_core.request import GenRequest


class QueueFullError(Exception):
    """The queue is at ``max_length``; the HTTP layer answers 429."""


class Tier(enum.Enum):
    GUARD = "guard"
    SLACK = "slack"
    UNKEYED = "unkeyed"


class AdaptiveTarget:
    """Online q-quantile of the keyed admission wait, clamped to ``[x_min, x_max]``.

    The first ``WARMUP_ADMISSIONS`` waits initialise X to their empirical quantile;
    after that each admission moves X by ``ETA * X * ([wait > X] - (1 - q))``
    (a multiplicative stochastic-approximation step, so X tracks the quantile in
    relative terms whatever its scale). Until initialised, X is ``None``: nothing
    is at risk and completions are not counted in the SLO statistics.
    """

    ETA = 0.05
    WARMUP_ADMISSIONS = 32

    def __init__(self, x_min: float, x_max: float, quantile: float = 0.9) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        self.quantile = quantile
        self.value: float | None = None
        self._warmup: list[float] = []
        self.x_min, self.x_max = x_min, x_max
        self.set_bounds(x_min, x_max)

    def set_bounds(self, x_min: float, x_max: float) -> None:
        if not (math.isfinite(x_min) and math.isfinite(x_max) and 0.0 < x_min <= x_max):
            raise ValueError(f"admission target bounds need 0 < min <= max, got {x_min}, {x_max}")
        self.x_min, self.x_max = x_min, x_max
        if self.value is not None:
            self.value = self._clamp(self.value)

    @property
    def is_initialised(self) -> bool:
        return self.value is not None

    def observe(self, wait: float) -> None:
        if self.value is None:
            self._warmup.append(wait)
            if len(self._warmup) >= self.WARMUP_ADMISSIONS:
                ordered = sorted(self._warmup)
                index = min(len(ordered) - 1, int(self.quantile * len(ordered)))
                self.value = self._clamp(ordered[index])
                self._warmup.clear()
            return
        above = 1.0 if wait > self.value else 0.0
        self.value = self._clamp(self.value * (1.0 + self.ETA * (above - (1.0 - self.quantile))))

    def _clamp(self, value: float) -> float:
        return min(self.x_max, max(self.x_min, value))


class AdmissionQueue:
    def __init__(
        self,
        max_length: int,
        target: AdaptiveTarget,
        slack_s: float,
        guard_factor: float = 2.0,
    ) -> None:
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = max_length
        self.target = target
        self.slack_s = slack_s
        self.guard_factor = guard_factor
        self._seq = 0
        # Keyed waiters sorted by (arrival_time, seq); the parallel list of arrival
        # times lets num_at_risk bisect instead of scanning.
        self._keyed: list[tuple[float, int, GenRequest]] = []
        self._keyed_arrivals: list[float] = []
        # Waiters with their own target, sorted by (deadline, seq); deadlines alongside.
        self._own: list[tuple[float, int, GenRequest]] = []
        self._own_deadlines: list[float] = []
        self._unkeyed: deque[GenRequest] = deque()
        self._index: dict[str, GenRequest] = {}

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._index

    def can_push(self) -> bool:
        return len(self._index) < self.max_length

    def push(self, request: GenRequest) -> None:
        if not self.can_push():
            raise QueueFullError(f"admission queue is full ({self.max_length} waiters)")
        if request.request_id in self._index:
            raise ValueError(f"request {request.request_id!r} is already waiting")
        self._index[request.request_id] = request
        if request.arrival_time is None:
            self._unkeyed.append(request)
            return
        # Equal arrival times keep push order: bisect_right puts the newcomer last.
        self._seq += 1
        if request.slo_ttft_s is not None:
            deadline = request.arrival_time + request.slo_ttft_s
            position = bisect.bisect_right(self._own_deadlines, deadline)
            self._own.insert(position, (deadline, self._seq, request))
            self._own_deadlines.insert(position, deadline)
            return
        position = bisect.bisect_right(self._keyed_arrivals, request.arrival_time)
        self._keyed.insert(position, (request.arrival_time, self._seq, request))
        self._keyed_arrivals.insert(position, request.arrival_time)

    def _is_own_head_first(self) -> bool:
        """The keyed head comes from the own-target list (it is not empty)."""
        if not self._own:
            return False
        if not self._keyed:
            return True
        x = self.target.value if self.target.value is not None else self.target.x_max
        pool_arrival, pool_seq, _ = self._keyed[0]
        own_deadline, own_seq, _ = self._own[0]
        return (own_deadline, own_seq) < (pool_arrival + x, pool_seq)

    def peek(self) -> GenRequest | None:
        if self._is_own_head_first():
            return self._own[0][2]
        if self._keyed:
            return self._keyed[0][2]
        return self._unkeyed[0] if self._unkeyed else None

    def pop(self, now: float) -> GenRequest:
        """Admit the head; a pool-target keyed head's wait feeds the adaptive target."""
        if self._is_own_head_first():
            _, _, request = self._own.pop(0)
            self._own_deadlines.pop(0)
        elif self._keyed:
            _, _, request = self._keyed.pop(0)
            self._keyed_arrivals.pop(0)
            assert request.arrival_time is not None
            self.target.observe(max(0.0, now - request.arrival_time))
        elif self._unkeyed:
            request = self._unkeyed.popleft()
        else:
            raise IndexError("pop from an empty admission queue")
        del self._index[request.request_id]
        return request

    def remove(self, request_id: str) -> GenRequest:
        request = self._index.pop(request_id)
        if request.arrival_time is None:
            self._unkeyed.remove(request)
            return request
        if request.slo_ttft_s is not None:
            deadline = request.arrival_time + request.slo_ttft_s
            _remove_sorted(self._own, self._own_deadlines, deadline, request)
            return request
        _remove_sorted(self._keyed, self._keyed_arrivals, request.arrival_time, request)
        return request

    def target_of(self, request: GenRequest) -> float | None:
        """The admission target a waiter is held to: D_i, else X (``None`` before warm-up)."""
        return request.slo_ttft_s if request.slo_ttft_s is not None else self.target.value

    def slack(self, request: GenRequest, now: float) -> float | None:
        """``D - (now - arrival_time)`` with D = D_i or X; ``None`` for unkeyed waiters or
        pool waiters before warm-up."""
        x = self.target_of(request)
        if x is None or request.arrival_time is None:
            return None
        return x - (now - request.arrival_time)

    def tier(self, request: GenRequest, now: float) -> Tier:
        x = self.target_of(request)
        if request.arrival_time is None:
            return Tier.UNKEYED
        if x is not None and now - request.arrival_time > self.guard_factor * x:
            return Tier.GUARD
        return Tier.SLACK

    def is_head_at_risk(self, now: float) -> bool:
        """The next pop is keyed with ``slack <= slack_s`` (late heads included)."""
        head = self.peek()
        if head is None:
            return False
        slack = self.slack(head, now)
        return slack is not None and slack <= self.slack_s

    def num_at_risk(self, now: float) -> int:
        """Keyed waiters with ``slack <= slack_s``: pool waiters with
        ``arrival <= now - X + slack_s``, own-target ones with ``deadline <= now + slack_s``."""
        num_own = bisect.bisect_right(self._own_deadlines, now + self.slack_s) if self._own else 0
        x = self.target.value
        if x is None:
            return num_own
        return num_own + bisect.bisect_right(self._keyed_arrivals, now - x + self.slack_s)


def _remove_sorted(
    entries: list[tuple[float, int, GenRequest]],
    keys: list[float],
    key: float,
    request: GenRequest,
) -> None:
    """Remove ``request`` (sort key ``key``) from a sorted list and its parallel keys."""
    start = bisect.bisect_left(keys, key)
    for position in range(start, len(entries)):
        if entries[position][2] is request:
            del entries[position]
            del keys[position]
            return
    raise AssertionError("queue index out of sync")  # pragma: no cover
