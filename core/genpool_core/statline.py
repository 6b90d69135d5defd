"""The periodic stat line (docs/design.md#stat-line): one module formats it and parses it.

Both follow the rows of ``genpool_core.stat_fields`` (keys, kinds, when shown, which
are required); ``StatLine`` has one attribute per row attribute (a unit test checks).
``a/b`` values are last window / since start. The parser tolerates any key order,
ignores unknown keys and returns ``None`` for anything that is not a stat line; it
never raises, because it reads text from other processes (HTTP bodies, pod logs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genpool_core import ttft_histogram
from genpool_core.names import SLO_MODE, TPOT_MODE
from genpool_core.stat_fields import FIELDS, Kind, Shown, StatField
from genpool_core.stats import SchedulerStats, SloModeStats, TpotModeStats

MARKER = "gen_preemption stats"
VICTIM_ORDER = ("laxity", "below_target", "sacrificed", "wait")


@dataclass(frozen=True, slots=True)
class StatLine:
    t: float
    mode: str
    residents: int
    active: int
    paused: int
    cap: int
    headroom: int
    waiters: int
    at_risk: int = 0
    target_output_tps: float | None = None
    admission_target_s: float | None = None
    below_target_window: float | None = None
    below_target_total: float | None = None
    credit: float | None = None
    victims: dict[str, int] = field(default_factory=dict)
    mean_laxity: float | None = None
    laxity_resumes: int = 0
    forced_resumes: int = 0
    paused_below_target: int | None = None
    completed_window: int = 0
    completed_total: int = 0
    slo_completed_window: int = 0  # completions below_target counts (keyed, with a floor)
    slo_completed_total: int = 0
    pauses_window: int = 0
    pauses_total: int = 0
    tpot_budget: float | None = None
    window_s: float | None = None
    inflation: float | None = None
    # load and GEN TTFT over the window (the replica scaler's inputs); zeros on old lines
    arrivals_window: int = 0
    arrivals_total: int = 0
    steps_window: int = 0
    batch_mean: float | None = None  # mean decode batch over the window's steps
    batch_seconds: float | None = None  # batch size x pass seconds over the window
    pause_budget: int | None = None  # at-risk waiters pausing could admit now; None: off
    ttft_hist: tuple[int, ...] = ()  # window counts per ttft_histogram bucket
    kv_used: float | None = None  # KV blocks held / the worker's blocks; None: no budget
    kv_paused: float | None = None  # the paused residents' blocks / the worker's blocks
    # speculative decoding: drafted tokens verified, and those emitted (0: off)
    drafted_window: int = 0
    drafted_total: int = 0
    accepted_window: int = 0
    accepted_total: int = 0

    @property
    def ttft_p90(self) -> float | None:
        return ttft_histogram.quantile(self.ttft_hist, 0.9)


def _ratio(num: int, den: int) -> float | None:
    return num / den if den > 0 else None


def make_statline(cur: SchedulerStats, prev: SchedulerStats | None) -> StatLine:
    """The line for the window ``(prev.t, cur.t]``; ``prev=None`` means since start."""
    base = prev or SchedulerStats(cur.t, cur.mode, None, 0, 0, 0, 0, 0, 0, 0, None)
    window_victims = {
        k: v - base.victims.get(k, 0) for k, v in cur.victims.items() if v > base.victims.get(k, 0)
    }
    laxity_victims = window_victims.get("laxity", 0)
    slo = cur.mode_stats if isinstance(cur.mode_stats, SloModeStats) else None
    tpot = cur.mode_stats if isinstance(cur.mode_stats, TpotModeStats) else None
    return StatLine(
        t=cur.t,
        mode=cur.mode,
        residents=cur.residents,
        active=cur.active,
        paused=cur.paused,
        cap=cur.paused_cap,
        headroom=cur.resident_headroom,
        waiters=cur.waiters,
        at_risk=cur.at_risk,
        target_output_tps=cur.target_output_tps,
        admission_target_s=cur.admission_target_s,
        below_target_window=_ratio(
            cur.below_target - base.below_target, cur.slo_completed - base.slo_completed
        ),
        below_target_total=_ratio(cur.below_target, cur.slo_completed),
        credit=None if slo is None else slo.credit,
        victims=window_victims,
        mean_laxity=(
            (cur.laxity_sum - base.laxity_sum) / laxity_victims if laxity_victims else None
        ),
        laxity_resumes=cur.laxity_resumes - base.laxity_resumes,
        forced_resumes=cur.forced_resumes - base.forced_resumes,
        paused_below_target=None if slo is None else slo.paused_below_target,
        completed_window=cur.completed - base.completed,
        completed_total=cur.completed,
        slo_completed_window=cur.slo_completed - base.slo_completed,
        slo_completed_total=cur.slo_completed,
        pauses_window=cur.pauses - base.pauses,
        pauses_total=cur.pauses,
        tpot_budget=None if tpot is None else tpot.budget,
        window_s=None if tpot is None else tpot.window_s,
        inflation=None if tpot is None else tpot.inflation,
        arrivals_window=cur.arrivals - base.arrivals,
        arrivals_total=cur.arrivals,
        steps_window=cur.steps - base.steps,
        batch_mean=_ratio(cur.batch_sum - base.batch_sum, cur.steps - base.steps),
        batch_seconds=(
            max(0.0, cur.batch_seconds - base.batch_seconds) if cur.arrivals > 0 else None
        ),
        pause_budget=cur.pause_budget,
        ttft_hist=ttft_histogram.window_counts(cur.ttft_counts, base.ttft_counts),
        kv_used=_ratio(cur.kv_blocks_used, cur.kv_blocks),
        kv_paused=_ratio(cur.kv_blocks_paused, cur.kv_blocks),
        drafted_window=cur.drafted - base.drafted,
        drafted_total=cur.drafted,
        accepted_window=cur.accepted - base.accepted,
        accepted_total=cur.accepted,
    )


def _fmt(value: float | None, digits: int | None) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_statline(line: StatLine) -> str:
    return f"{MARKER} " + " ".join(_tokens(line, FIELDS))


def _tokens(line: StatLine, fields: tuple[StatField, ...]) -> list[str]:
    """``key=value`` for each row the line shows, in the rows' order."""
    return [f"{row.key}={_text(row, line)}" for row in fields if _is_shown(row, line)]


def _is_shown(row: StatField, line: StatLine) -> bool:
    match row.shown:
        case Shown.ALWAYS:
            return True
        case Shown.SLO:
            return line.mode == SLO_MODE
        case Shown.TPOT:
            return line.mode == TPOT_MODE
        case Shown.SLO_OR_SET:
            return line.mode == SLO_MODE or _is_set(row, line)
        case Shown.ARRIVALS:  # a worker that never saw a request has nothing to say here
            return line.arrivals_total > 0
        case Shown.SET:
            return _is_set(row, line)


def _is_set(row: StatField, line: StatLine) -> bool:
    value = getattr(line, row.attrs[-1])
    return value is not None and (row.kind is not Kind.INT_PAIR or value > 0)


def _text(row: StatField, line: StatLine) -> str:
    values = [getattr(line, attr) for attr in row.attrs]
    match row.kind:
        case Kind.FLOAT | Kind.FLOAT_PAIR:
            return "/".join(_fmt(value, row.digits) for value in values)
        case Kind.TEXT | Kind.INT | Kind.INT_PAIR:
            return "/".join(f"{value}" for value in values)
        case Kind.OPT_INT:
            return "-" if values[0] is None else f"{values[0]}"
        case Kind.VICTIMS:
            victims: dict[str, int] = values[0]
            kinds = sorted(victims, key=_victim_rank)
            return ",".join(f"{k}:{victims[k]}" for k in kinds) or "-"
        case Kind.HISTOGRAM:
            return ttft_histogram.format_sparse(values[0])


def _victim_rank(kind: str) -> tuple[int, str]:
    known = kind in VICTIM_ORDER
    return (VICTIM_ORDER.index(kind) if known else len(VICTIM_ORDER), kind)


# -- parsing ------------------------------------------------------------------------


class _Garbage(Exception):
    """A field that cannot be read: the whole line is not a stat line."""


def _parse_float(text: str) -> float | None:
    if text == "-":
        return None
    value = float(text)
    if not math.isfinite(value):
        raise _Garbage(text)
    return value


def _parse_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise _Garbage(text)
    return value


def _parse_pair(text: str) -> tuple[str, str]:
    window, sep, total = text.partition("/")
    if not sep:
        raise _Garbage(text)
    return window, total


def _parse_victims(text: str) -> dict[str, int]:
    if text == "-":
        return {}
    victims: dict[str, int] = {}
    for item in text.split(","):
        kind, sep, count = item.partition(":")
        if not sep or not kind:
            raise _Garbage(item)
        victims[kind] = _parse_int(count)
    return victims


def _parse_fields(fields: dict[str, str], table: tuple[StatField, ...]) -> dict[str, object]:
    """The attributes of the rows present in ``fields`` (raises on a bad value)."""
    values: dict[str, object] = {}
    for row in table:
        if row.key in fields and not row.derived:
            values.update(zip(row.attrs, _read(row, fields[row.key]), strict=True))
    return values


def _read(row: StatField, text: str) -> tuple[object, ...]:
    match row.kind:
        case Kind.TEXT:
            return (text,)
        case Kind.INT:
            return (_parse_int(text),)
        case Kind.OPT_INT:
            return (None if text == "-" else _parse_int(text),)
        case Kind.FLOAT:
            return (_parse_float(text),)
        case Kind.FLOAT_PAIR:
            return tuple(_parse_float(part) for part in _parse_pair(text))
        case Kind.INT_PAIR:
            return tuple(_parse_int(part) for part in _parse_pair(text))
        case Kind.VICTIMS:
            return (_parse_victims(text),)
        case Kind.HISTOGRAM:
            return (ttft_histogram.parse_sparse(text),)


def parse_statline(text: object) -> StatLine | None:
    """The last stat line in ``text`` (one line or a log tail), or ``None``."""
    lines = parse_statlines(text)
    return lines[-1] if lines else None


def parse_statlines(text: object) -> list[StatLine]:
    """Every stat line in ``text`` (a log tail, ``GET /statlines``), in order; what is
    not a stat line is skipped. Never raises."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return []
    return [parsed for line in text.splitlines() if (parsed := _parse_one(line)) is not None]


def _parse_one(line: str) -> StatLine | None:
    values = _parse_values(line, FIELDS)
    return None if values is None else StatLine(**values)  # type: ignore[arg-type]


def _parse_values(line: str, table: tuple[StatField, ...]) -> dict[str, object] | None:
    """The attributes a stat line in ``line`` sets; ``None`` if there is none, if a
    required row is missing or ``-``, or if any value is garbage."""
    _, marker, rest = line.partition(MARKER)
    if not marker:
        return None
    fields: dict[str, str] = {}
    for token in rest.split():
        key, sep, value = token.partition("=")
        if sep and key:
            fields[key] = value
    required = [row for row in table if row.required]
    if any(row.key not in fields for row in required):
        return None
    try:
        values = _parse_fields(fields, table)
    except (ValueError, _Garbage):
        return None
    if any(values[attr] is None for row in required for attr in row.attrs):
        return None
    return values
