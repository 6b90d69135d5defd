"""One request's own SLO, from llm-d's headers or the body's ``slo`` extension
(docs/worker.md#per-request-slo): an admission target D_i (TTFT) and an output-rate
floor T_i = 1000 / tpot_ms. A request with neither gets the pool's T and X."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from genpool_worker.http_common import ApiError

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
BODY_FIELDS = {"ttft_ms": TTFT_HEADER, "tpot_ms": TPOT_HEADER}
# Beyond an hour an SLO is a units mistake (seconds sent as ms, or ns), not a target.
MAX_SLO_MS = 3_600_000.0


@dataclass(frozen=True, slots=True)
class RequestSlo:
    ttft_s: float | None = None
    target_output_tps: float | None = None


def _milliseconds(value: object, name: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ApiError(400, f"{name}: not a number: {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{name}: must be a number of milliseconds, got {value!r}")
    try:
        ms = float(value)
    except OverflowError:  # an integer too large for a float: out of range, not a crash
        ms = math.inf
    if not (math.isfinite(ms) and 0.0 < ms <= MAX_SLO_MS):
        shown = f"{value!r}"[:40]
        raise ApiError(400, f"{name}: must be in (0, {MAX_SLO_MS:.0f}] ms, got {shown}")
    return ms


def request_slo(headers: Mapping[str, str], body: Mapping[str, object] | None) -> RequestSlo:
    """The SLO a request asks for; a body field overrides its header. Raises a 400
    naming the header or field for a value that is not a positive, finite number of ms."""
    values: dict[str, float] = {}
    for field, header in BODY_FIELDS.items():
        if header in headers:
            values[field] = _milliseconds(headers[header], header)
    for field, value in (body or {}).items():
        if field not in BODY_FIELDS:
            raise ApiError(400, f"slo.{field}: unknown field (expected ttft_ms, tpot_ms)")
        if value is not None:
            values[field] = _milliseconds(value, f"slo.{field}")
    ttft_ms, tpot_ms = values.get("ttft_ms"), values.get("tpot_ms")
    return RequestSlo(
        ttft_s=None if ttft_ms is None else ttft_ms / 1000.0,
        target_output_tps=None if tpot_ms is None else 1000.0 / tpot_ms,
    )
