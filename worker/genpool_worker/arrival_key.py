"""When a request arrived, the key of its admission (docs/design.md#keyed-by-default).

A request that reaches a worker is keyed, so it can be at risk, trigger pauses and count in
the SLO statistics, with the earliest arrival anyone vouches for, first match wins:

1. ``genpool.keyed: false`` in the body: unkeyed, on purpose (warm-up, synthetic probes);
2. ``genpool.arrival_time`` in the body (a context server or a client that knows);
3. the ``x-genpool-arrival-time`` header (a router stamping what reached the gateway);
4. its receipt at this worker, unless the worker runs with ``stamp_arrival`` off; a request
   that states its own SLO (llm-d's headers, or the body's ``slo``) is stamped even then,
   because an admission target needs a clock to run against.

Stamps are Unix seconds; one beyond ``ARRIVAL_SKEW_TOLERANCE_S`` in the future is refused
with a 422 naming where it came from, a malformed header value with a 400.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from genpool_worker.api import ARRIVAL_SKEW_TOLERANCE_S, GenPoolTiming
from genpool_worker.http_common import ApiError

ARRIVAL_HEADER = "x-genpool-arrival-time"
# A decimal Unix time is at most this long (sign, 20 digits, point, 20 digits); longer is junk.
MAX_HEADER_CHARS = 48


def arrival_key(
    timing: GenPoolTiming | None,
    headers: Mapping[str, str],
    *,
    has_own_slo: bool,
    stamp_arrival: bool,
    now: float,
) -> float | None:
    """The request's ``arrival_time`` (Unix s), or ``None`` for unkeyed; raises ``ApiError``.
    ``stamp_arrival`` is the worker's side of the rule: key receipt when nothing upstream did."""
    if timing is not None and timing.keyed is False:
        if timing.arrival_time is not None:
            raise ApiError(422, "genpool.keyed is false but genpool.arrival_time is set")
        return None
    if timing is not None and timing.arrival_time is not None:
        return _not_in_future(timing.arrival_time, "genpool.arrival_time", now)
    if ARRIVAL_HEADER in headers:
        return _not_in_future(_header_time(headers[ARRIVAL_HEADER]), ARRIVAL_HEADER, now)
    if stamp_arrival or has_own_slo:
        return now
    return None


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
