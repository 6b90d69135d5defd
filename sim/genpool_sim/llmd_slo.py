"""llm-d's SLO-aware autoscaling law, as published, for the simulator's ``llm-d-slo``
baseline (a pool without pausing; not GenPool's law, which is
:mod:`genpool_core.scaler`).

From llm-d's guide ``guides/workload-autoscaling/slo-aware`` (PR llm-d#2011):

- every 15 s, ``s_raw = max(p90 TTFT / S_ttft, p90 TPOT / S_tpot)`` over the last
  minute (the endpoint picker's latency histograms; here the simulator's records:
  GEN TTFT of the first tokens in the minute, TPOT of the requests finished in it),
  clamped at 2 and averaged over the last 45 s;
- ``s > 0.55``: ``n + ceil(n (s c / 0.55 - 1))`` with in-flight credit
  ``c = ready / provisioned``; ``s < 0.40``: ``n - floor(n (1 - s / 0.40))`` on the
  uncredited signal; else hold;
- the HPA's behaviour: up by at most max(100 %, 4 pods) per 60 s after a 30 s
  stabilisation window (the lowest recommendation of the last 30 s), down by at most
  one pod per 120 s after a 180 s window (the highest recommendation of the last 180 s);
  never outside [min, max].

``S_tpot`` is the pool's floor T as a TPOT, 1 / T.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from genpool_core.quantiles import percentile
from genpool_sim.cluster import Cluster

PERIOD_S = 15.0
LOOKBACK_S = 60.0
AVERAGE_S = 45.0
CLAMP = 2.0
UP_AT, DOWN_AT = 0.55, 0.40
UP_WINDOW_S, DOWN_WINDOW_S = 30.0, 180.0
UP_PERIOD_S, DOWN_PERIOD_S = 60.0, 120.0
UP_PODS = 4


@dataclass(frozen=True)
class LlmdSloSettings:
    ttft_s: float  # S_ttft: the p90 TTFT SLO
    tpot_s: float  # S_tpot: the p90 TPOT SLO (1 / T)
    min_replicas: int
    max_replicas: int
    startup_delay_s: float


class LlmdSloPool:
    """The baseline's controller in the simulator's loop (as :class:`SimPool`)."""

    interval_s = PERIOD_S

    def __init__(self, settings: LlmdSloSettings) -> None:
        self.settings = settings
        self.timeline: list[dict[str, object]] = []
        self._signals: deque[tuple[float, float]] = deque()
        self._recommendations: deque[tuple[float, int]] = deque()
        self._changes: deque[tuple[float, int]] = deque()  # (time, replicas before)
        self._desired = 0

    def attach(self, cluster: Cluster) -> None:
        self._desired = len(cluster.workers)
        self.timeline.append({"t": 0.0, "desired": self._desired, "ready": self._desired,
                              "reason": "start", "ttft_p90": None})  # fmt: skip

    def tick(self, cluster: Cluster, now: float) -> None:
        ttft, tpot = _latencies(cluster, now)
        raw = max((ttft or 0.0) / self.settings.ttft_s, (tpot or 0.0) / self.settings.tpot_s)
        self._signals.append((now, min(CLAMP, raw)))
        while self._signals and now - self._signals[0][0] >= AVERAGE_S:
            self._signals.popleft()
        signal = sum(s for _, s in self._signals) / len(self._signals)
        n = self._desired
        ready = sum(1 for worker in cluster.workers if worker.is_routable)
        recommended = _recommend(n, signal, ready)
        desired, reason = self._hpa(now, n, recommended)
        if desired != n:
            self._changes.append((now, n))
            cluster.scale_to(desired, self.settings.startup_delay_s)
            self._desired = desired
        self.timeline.append({"t": now, "desired": desired, "ready": ready, "reason": reason,
                              "ttft_p90": ttft, "signal": round(signal, 3)})  # fmt: skip

    def _hpa(self, now: float, n: int, recommended: int) -> tuple[int, str]:
        """The HPA's stabilisation windows and scaling policies on the recommendation."""
        self._recommendations.append((now, recommended))
        while self._recommendations and now - self._recommendations[0][0] > DOWN_WINDOW_S:
            self._recommendations.popleft()
        lo, hi = self.settings.min_replicas, self.settings.max_replicas
        recent_up = [r for t, r in self._recommendations if now - t <= UP_WINDOW_S]
        if min(recent_up) > n:
            base = min((before for t, before in self._changes if now - t < UP_PERIOD_S),
                       default=n)  # fmt: skip
            limit = base + max(base, UP_PODS)
            return min(min(recent_up), limit, hi), "up"
        highest = max(r for _, r in self._recommendations)
        if highest < n:
            recent = [t for t, before in self._changes if now - t < DOWN_PERIOD_S]
            if recent:
                return n, "hold-down-period"
            return max(n - 1, highest, lo), "down"
        return max(lo, min(n, hi)), "hold"


def _recommend(n: int, signal: float, ready: int) -> int:
    if signal > UP_AT:
        credit = ready / max(1, n)
        return n + max(0, math.ceil(n * (signal * credit / UP_AT - 1)))
    if signal < DOWN_AT:
        return n - math.floor(n * (1 - signal / DOWN_AT))
    return n


def _latencies(cluster: Cluster, now: float) -> tuple[float | None, float | None]:
    """p90 GEN TTFT of the first tokens, p90 TPOT of the completions, in the last minute."""
    ttfts: list[float] = []
    tpots: list[float] = []
    since = now - LOOKBACK_S
    for request in cluster.requests.values():
        gen = request.gen
        if gen is None or request.gen_arrival is None:
            continue
        first = gen.first_gen_token_time
        if first is not None and since < first <= now:
            ttfts.append(first - request.gen_arrival)
        last, tokens = gen.last_token_time, gen.num_output_tokens
        is_done = request.is_done and first is not None and last is not None and tokens > 2
        if is_done and since < last <= now:  # type: ignore[operator]
            tpots.append((last - first) / (tokens - 2))  # type: ignore[operator]
    ttft = percentile(ttfts, 90) if ttfts else None
    tpot = percentile(tpots, 90) if tpots else None
    return ttft, tpot
