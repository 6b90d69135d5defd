"""When a request arrived, the key of its admission (docs/design.md#keyed-by-default).

A request that reaches a worker is keyed, so it can be at risk, trigger pauses and count in
the SLO statistics, with the arrival the most trusted source vouches for, first match wins:

1. ``genpool.keyed: false`` in the body: unkeyed, on purpose (warm-up, synthetic probes);
2. the ``x-genpool-arrival-time`` header (a router stamping what reached the gateway: a
   gateway that stamps overwrites whatever a client put there);
3. ``genpool.arrival_time`` in the body (a context server, or any client);
4. its receipt at this worker, unless the worker runs with ``stamp_arrival`` off; a request
   that states its own SLO (llm-d's headers, or the body's ``slo``) is stamped even then,
   because an admission target needs a clock to run against.

Stamps are Unix seconds; one beyond ``ARRIVAL_SKEW_TOLERANCE_S`` in the future is refused
with a 422 naming where it came from, a malformed header value with a 400. One older than
``max_age_s`` (``--max-arrival-age-s``) is clamped to that age: a request is never lost for
an old stamp, and no stamp moves it further ahead of the queue, makes it more at risk or
adds more to the stat line's TTFT than that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from genpool_worker.api import (
    ARRIVAL_SKEW_TOLERANCE_S,
    DEFAULT_MAX_ARRIVAL_AGE_S,
    ArrivalSource,
    GenPoolTiming,
)
from genpool_worker.http_common import ApiError

ARRIVAL_HEADER = "x-genpool-arrival-time"
# A decimal Unix time is at most this long (sign, 20 digits, point, 20 digits); longer is junk.
MAX_HEADER_CHARS = 48
__all__ = ["ARRIVAL_HEADER", "DEFAULT_MAX_ARRIVAL_AGE_S", "ArrivalKey", "arrival_key"]


@dataclass(frozen=True, slots=True)
class ArrivalKey:
    """``time``: the request's ``arrival_time`` (Unix s; None: unkeyed), which source set
    it, and whether it was older than the bound (clamped)."""

    time: float | None
    source: ArrivalSource
    is_clamped: bool = False


def arrival_key(
    timing: GenPoolTiming | None,
    headers: Mapping[str, str],
    *,
    has_own_slo: bool,
    stamp_arrival: bool,
    now: float,
    max_age_s: float = DEFAULT_MAX_ARRIVAL_AGE_S,
) -> ArrivalKey:
    """The request's key; raises ``ApiError``. ``stamp_arrival`` is the worker's side of the
    rule: key receipt when nothing upstream did."""
    if timing is not None and timing.keyed is False:
        if timing.arrival_time is not None:
            raise ApiError(422, "genpool.keyed is false but genpool.arrival_time is set")
        return ArrivalKey(None, "unkeyed")
    if ARRIVAL_HEADER in headers:
        stamp = _not_in_future(_header_time(headers[ARRIVAL_HEADER]), ARRIVAL_HEADER, now)
        return _bounded(stamp, "header", now, max_age_s)
    if timing is not None and timing.arrival_time is not None:
        stamp = _not_in_future(timing.arrival_time, "genpool.arrival_time", now)
        return _bounded(stamp, "body", now, max_age_s)
    if stamp_arrival or has_own_slo:
        return ArrivalKey(now, "receipt")
    return ArrivalKey(None, "unkeyed")


def _bounded(stamp: float, source: ArrivalSource, now: float, max_age_s: float) -> ArrivalKey:
    oldest = now - max_age_s
    return ArrivalKey(oldest, source, True) if stamp < oldest else ArrivalKey(stamp, source)


def _header_time(raw: str) -> float:
    text = raw.strip()
    try:
        if len(text) > MAX_HEADER_CHARS:
            raise ValueError
        value = float(text)
    except ValueError:
        raise ApiError(
            400, f"{ARRIVAL_HEADER}: not a Unix time in seconds: {raw[:MAX_HEADER_CHARS]!r}"
        ) from None
    if not (math.isfinite(value) and value >= 0.0):
        raise ApiError(400, f"{ARRIVAL_HEADER}: must be a finite Unix time >= 0, got {raw!r}")
    return value


def _not_in_future(arrival: float, source: str, now: float) -> float:
    if arrival > now + ARRIVAL_SKEW_TOLERANCE_S:
        raise ApiError(422, f"{source} is {arrival - now:.1f} s in the future")
    return arrival
