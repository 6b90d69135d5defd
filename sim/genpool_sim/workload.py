"""Simulator workloads (docs/design.md#workloads): trace replay, time scaling, Gamma arrivals
and the length sampler of the closed loop.

Pure: parsers take lines of text (a file object, ``str.splitlines()``, a list),
randomness comes from a caller-seeded ``random.Random``, so every workload is a
function of its inputs and seed. The CLI opens the files.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

CSV_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
JSONL_KEYS = ("timestamp", "input_length", "output_length")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload: when it arrives and how long it is."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


class TraceError(ValueError):
    """A trace that cannot be replayed; the message reads ``source:line: what``."""

    def __init__(self, source: str, line: int, what: str) -> None:
        super().__init__(f"{source}:{line}: {what}")
        self.source = source
        self.line = line
        self.what = what


def _fail(source: str, line: int, what: str) -> NoReturn:
    raise TraceError(source, line, what)


def _checked(
    source: str, line: int, arrival_s: float, prompt: int, output: int, previous_s: float
) -> TraceRequest:
    # One set of rules for both formats, so a trace means the same in CSV and JSONL.
    if not math.isfinite(arrival_s) or arrival_s < 0:
        _fail(source, line, f"arrival time {arrival_s!r} s is not a finite value >= 0")
    if arrival_s < previous_s:
        # Replay is open loop in file order; a decreasing time is a broken or
        # concatenated file, and silently sorting it would hide that.
        _fail(source, line, f"arrival time {arrival_s} s is before the previous {previous_s} s")
    if prompt < 1:
        _fail(source, line, f"prompt length {prompt} must be >= 1 token")
    if output < 1:
        _fail(source, line, f"output length {output} must be >= 1 token")
    return TraceRequest(arrival_s, prompt, output)


def _csv_float(source: str, line: int, column: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        _fail(source, line, f"column {column}: {text!r} is not a number")


def _csv_int(source: str, line: int, column: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        # Some exports write counts as "374.0"; accept integral floats, nothing else.
        value = _csv_float(source, line, column, text)
    if not value.is_integer():
        _fail(source, line, f"column {column}: {text!r} is not an integer")
    return int(value)


def parse_csv_trace(lines: Iterable[str], source: str = "<trace>") -> list[TraceRequest]:
    """Parse ``arrived_at,num_prefill_tokens,num_decode_tokens`` rows (seconds, tokens).

    The columns may come in any order; extra columns are ignored; blank lines are
    skipped. Raises TraceError naming the line for any bad or missing value.
    """
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        _fail(source, 1, "empty trace: no header line")
    names = [name.strip() for name in header]
    missing = [column for column in CSV_COLUMNS if column not in names]
    if missing:
        _fail(source, reader.line_num, f"header lacks column(s) {', '.join(missing)}")
    index = {column: names.index(column) for column in CSV_COLUMNS}
    width = max(index.values()) + 1
    trace: list[TraceRequest] = []
    previous_s = 0.0
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < width:
            _fail(source, line, f"{len(row)} field(s), the header needs at least {width}")
        cells = {column: row[i].strip() for column, i in index.items()}
        request = _checked(
            source,
            line,
            _csv_float(source, line, "arrived_at", cells["arrived_at"]),
            _csv_int(source, line, "num_prefill_tokens", cells["num_prefill_tokens"]),
            _csv_int(source, line, "num_decode_tokens", cells["num_decode_tokens"]),
            previous_s,
        )
        trace.append(request)
        previous_s = request.arrival_s
    if not trace:
        _fail(source, reader.line_num, "trace has no requests after the header")
    return trace


def _json_number(source: str, line: int, key: str, value: object) -> float:
    # bool is an int subclass in Python; true/false is never a length or a time.
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(source, line, f"{key}: {value!r} is not a number")
    return float(value)


def _json_int(source: str, line: int, key: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = _json_number(source, line, key, value)
    if not number.is_integer():
        _fail(source, line, f"{key}: {value!r} is not an integer")
    return int(number)


def parse_jsonl_trace(lines: Iterable[str], source: str = "<trace>") -> list[TraceRequest]:
    """Parse JSON lines ``{"timestamp": ms, "input_length": n, "output_length": m}``.

    Timestamps are milliseconds and come out in seconds. Blank lines are skipped,
    other keys ignored; the rules are those of the CSV parser.
    """
    trace: list[TraceRequest] = []
    previous_s = 0.0
    last_line = 0
    for line, text in enumerate(lines, start=1):
        last_line = line
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            _fail(source, line, f"bad JSON: {error.msg} at column {error.colno}")
        if not isinstance(record, dict):
            _fail(source, line, f"expected a JSON object, got {type(record).__name__}")
        missing = [key for key in JSONL_KEYS if key not in record]
        if missing:
            _fail(source, line, f"missing key(s) {', '.join(missing)}")
        request = _checked(
            source,
            line,
            _json_number(source, line, "timestamp", record["timestamp"]) / 1000.0,
            _json_int(source, line, "input_length", record["input_length"]),
            _json_int(source, line, "output_length", record["output_length"]),
            previous_s,
        )
        trace.append(request)
        previous_s = request.arrival_s
    if not trace:
        _fail(source, max(last_line, 1), "trace has no requests")
    return trace


def scale_time(trace: Iterable[TraceRequest], factor: float) -> list[TraceRequest]:
    """Multiply every arrival time by ``factor``: below 1 compresses (more load)."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"time scale factor must be finite and > 0, got {factor!r}")
    return [replace(request, arrival_s=request.arrival_s * factor) for request in trace]


class LengthSampler:
    """Draws (prompt_tokens, output_tokens) pairs of a trace, with replacement.

    Pairs stay together: prompt and output lengths are correlated in real traces,
    and drawing them independently would invent requests that never occur.
    """

    def __init__(self, trace: Iterable[TraceRequest], rng: random.Random) -> None:
        self._pairs = tuple((r.prompt_tokens, r.output_tokens) for r in trace)
        if not self._pairs:
            raise ValueError("cannot sample lengths from an empty trace")
        self._rng = rng

    def __len__(self) -> int:
        return len(self._pairs)

    def sample(self) -> tuple[int, int]:
        """One (prompt_tokens, output_tokens) pair, uniformly over the trace's requests."""
        return self._rng.choice(self._pairs)


def gamma_arrivals(
    rate: float,
    cv: float,
    trace: Sequence[TraceRequest],
    rng: random.Random,
    *,
    n: int | None = None,
    duration_s: float | None = None,
) -> list[TraceRequest]:
    """An open-loop renewal process: Gamma inter-arrival gaps, trace lengths.

    Gaps have mean ``1 / rate`` and coefficient of variation ``cv`` (shape
    ``1 / cv**2``, scale ``1 / (rate * shape)``; cv = 1 is Poisson, above 1
    burstier). The first request arrives one gap after 0. Give exactly one of
    ``n`` (that many requests) or ``duration_s`` (all arrivals at or before it).
    Each request draws a gap, then a length pair, from ``rng``, in that order.
    """
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"arrival rate must be finite and > 0, got {rate!r}")
    if not (math.isfinite(cv) and cv > 0):
        raise ValueError(f"arrival CV must be finite and > 0, got {cv!r}")
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n and duration_s")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be finite and > 0, got {duration_s!r}")
    lengths = LengthSampler(trace, rng)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    out: list[TraceRequest] = []
    now = 0.0
    while n is None or len(out) < n:
        now += rng.gammavariate(shape, scale)
        if duration_s is not None and now > duration_s:
            break
        prompt, output = lengths.sample()
        out.append(TraceRequest(now, prompt, output))
    return out


@dataclass(frozen=True, slots=True)
class RatePhase:
    duration_s: float
    rate: float  # requests/s; 0 is a quiet phase


def parse_rate_phases(text: str) -> list[RatePhase]:
    """``"600:4,600:12,600:4"``: (seconds, requests/s) per phase, in order."""
    phases = []
    for index, item in enumerate(text.split(","), start=1):
        duration, sep, rate = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            phase = RatePhase(float(duration), float(rate))
        except ValueError:
            raise ValueError(
                f"phase {index} {item!r}: expected SECONDS:RATE, two numbers"
            ) from None
        if not (math.isfinite(phase.duration_s) and phase.duration_s > 0):
            raise ValueError(f"phase {index} {item!r}: need SECONDS > 0")
        if not (math.isfinite(phase.rate) and phase.rate >= 0):
            raise ValueError(f"phase {index} {item!r}: need RATE >= 0")
        phases.append(phase)
    if not any(phase.rate for phase in phases):
        raise ValueError("rate phases: at least one phase needs a rate above 0")
    return phases


def phased_gamma_arrivals(
    phases: Sequence[RatePhase], cv: float, trace: Sequence[TraceRequest], rng: random.Random
) -> list[TraceRequest]:
    """Gamma arrivals whose rate changes by phase; each phase restarts the renewal
    process at its start. One phase reproduces :func:`gamma_arrivals` draw for draw."""
    out: list[TraceRequest] = []
    start = 0.0
    for phase in phases:
        if phase.rate > 0:
            shifted = gamma_arrivals(phase.rate, cv, trace, rng, duration_s=phase.duration_s)
            out += [replace(r, arrival_s=start + r.arrival_s) for r in shifted]
        start += phase.duration_s
    return out
