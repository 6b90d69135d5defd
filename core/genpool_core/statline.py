"""The periodic stat line (docs/design.md#stat-line): one module formats it and parses it.

``a/b`` values are last window / since start. The parser tolerates any key order,
ignores unknown keys and returns ``None`` for anything that is not a stat line; it
never raises, because it reads text from other processes (HTTP bodies, pod logs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genpool_core import ttft_histogram
from genpool_core.names import SLO_MODE, TPOT_MODE
from genpool_core.stats import SchedulerStats

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
    ttft_hist: tuple[int, ...] = ()  # window counts per ttft_histogram bucket

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
    mode_fields = cur.mode_fields
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
        credit=_opt_float(mode_fields.get("credit")),
        victims=window_victims,
        mean_laxity=(
            (cur.laxity_sum - base.laxity_sum) / laxity_victims if laxity_victims else None
        ),
        laxity_resumes=cur.laxity_resumes - base.laxity_resumes,
        forced_resumes=cur.forced_resumes - base.forced_resumes,
        paused_below_target=_opt_int(mode_fields.get("paused_below_target")),
        completed_window=cur.completed - base.completed,
        completed_total=cur.completed,
        pauses_window=cur.pauses - base.pauses,
        pauses_total=cur.pauses,
        tpot_budget=_opt_float(mode_fields.get("budget")),
        window_s=_opt_float(mode_fields.get("window")),
        inflation=_opt_float(mode_fields.get("inflation")),
        arrivals_window=cur.arrivals - base.arrivals,
        arrivals_total=cur.arrivals,
        steps_window=cur.steps - base.steps,
        batch_mean=_ratio(cur.batch_sum - base.batch_sum, cur.steps - base.steps),
        ttft_hist=ttft_histogram.window_counts(cur.ttft_counts, base.ttft_counts),
    )


def _opt_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _opt_int(value: object) -> int | None:
    return int(value) if isinstance(value, int) else None


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_pair(window: float | None, total: float | None, digits: int) -> str:
    return f"{_fmt(window, digits)}/{_fmt(total, digits)}"


def format_statline(line: StatLine) -> str:
    parts = [f"t={line.t:.1f}", f"mode={line.mode}"]
    if line.mode == SLO_MODE:
        parts.append(f"T={_fmt(line.target_output_tps, 2)}")
    if line.mode == TPOT_MODE:
        parts.append(f"budget={_fmt(line.tpot_budget, 3)}")
        parts.append(f"window={_fmt(line.window_s, 3)}")
        parts.append(f"inflation={_fmt(line.inflation, 3)}")
    parts += [
        f"residents={line.residents}",
        f"active={line.active}",
        f"paused={line.paused}",
        f"cap={line.cap}",
        f"headroom={line.headroom}",
        f"waiters={line.waiters}",
        f"at_risk={line.at_risk}",
        f"X={_fmt(line.admission_target_s, 2)}",
    ]
    # Other modes count only requests with their own floor T_i: shown once there are any.
    if line.mode == SLO_MODE or line.below_target_total is not None:
        parts.append(
            f"below_target={_fmt_pair(line.below_target_window, line.below_target_total, 3)}"
        )
    if line.mode == SLO_MODE:
        parts.append(f"credit={_fmt(line.credit, 2)}")
    kinds = sorted(line.victims, key=_victim_rank)
    victims = ",".join(f"{k}:{line.victims[k]}" for k in kinds) or "-"
    parts.append(f"victims={victims}")
    if line.mode == SLO_MODE:
        parts.append(f"mean_laxity={_fmt(line.mean_laxity, 2)}")
        parts.append(f"laxity_resumes={line.laxity_resumes}")
    parts.append(f"forced_resumes={line.forced_resumes}")
    if line.mode == SLO_MODE:
        parts.append(f"paused_below_target={_opt_text(line.paused_below_target)}")
    parts.append(f"completed={line.completed_window}/{line.completed_total}")
    parts.append(f"pauses={line.pauses_window}/{line.pauses_total}")
    if line.arrivals_total > 0:  # a worker that never saw a request has nothing to say here
        parts += [
            f"arrivals={line.arrivals_window}/{line.arrivals_total}",
            f"steps={line.steps_window}",
            f"batch={_fmt(line.batch_mean, 2)}",
            f"ttft_p90={_fmt(line.ttft_p90, 3)}",  # for people; parsers read the histogram
            f"ttft_hist={ttft_histogram.format_sparse(line.ttft_hist)}",
        ]
    return f"{MARKER} " + " ".join(parts)


def _victim_rank(kind: str) -> tuple[int, str]:
    known = kind in VICTIM_ORDER
    return (VICTIM_ORDER.index(kind) if known else len(VICTIM_ORDER), kind)


def _opt_text(value: int | None) -> str:
    return "-" if value is None else str(value)


# -- parsing ------------------------------------------------------------------------

_INT_KEYS = {
    "residents": "residents",
    "active": "active",
    "paused": "paused",
    "cap": "cap",
    "headroom": "headroom",
    "waiters": "waiters",
    "at_risk": "at_risk",
    "laxity_resumes": "laxity_resumes",
    "forced_resumes": "forced_resumes",
    "steps": "steps_window",
}
_REQUIRED = ("t", "mode", "residents", "active", "paused", "cap", "headroom", "waiters")
_FLOAT_KEYS = {
    "t": "t",
    "T": "target_output_tps",
    "X": "admission_target_s",
    "credit": "credit",
    "mean_laxity": "mean_laxity",
    "budget": "tpot_budget",
    "window": "window_s",
    "inflation": "inflation",
    "batch": "batch_mean",
}


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


def _parse_fields(fields: dict[str, str]) -> dict[str, object]:
    values: dict[str, object] = {"mode": fields["mode"]}
    for key, name in _INT_KEYS.items():
        if key in fields:
            values[name] = _parse_int(fields[key])
    for key, name in _FLOAT_KEYS.items():
        if key in fields:
            values[name] = _parse_float(fields[key])
    if "paused_below_target" in fields:
        text = fields["paused_below_target"]
        values["paused_below_target"] = None if text == "-" else _parse_int(text)
    if "victims" in fields:
        values["victims"] = _parse_victims(fields["victims"])
    if "below_target" in fields:
        window, total = _parse_pair(fields["below_target"])
        values["below_target_window"] = _parse_float(window)
        values["below_target_total"] = _parse_float(total)
    if "ttft_hist" in fields:
        values["ttft_hist"] = ttft_histogram.parse_sparse(fields["ttft_hist"])
    for key in ("completed", "pauses", "arrivals"):
        if key in fields:
            window, total = _parse_pair(fields[key])
            values[f"{key}_window"] = _parse_int(window)
            values[f"{key}_total"] = _parse_int(total)
    return values


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
    _, marker, rest = line.partition(MARKER)
    if not marker:
        return None
    fields: dict[str, str] = {}
    for token in rest.split():
        key, sep, value = token.partition("=")
        if sep and key:
            fields[key] = value
    if any(key not in fields for key in _REQUIRED):
        return None
    try:
        values = _parse_fields(fields)
        if values.get("t") is None:
            return None
        return StatLine(**values)  # type: ignore[arg-type]
    except (ValueError, TypeError, _Garbage):
        return None
