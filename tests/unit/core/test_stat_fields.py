"""The stat-field table (genpool_core.stat_fields) against the dataclasses it drives, and
the generic format / parse / aggregate machinery over every row (one added row too)."""

from __future__ import annotations

import dataclasses

import pytest

from genpool_core import ttft_histogram
from genpool_core.aggregate import PoolStats, _pooled_values, aggregate
from genpool_core.names import OFF_MODE, SLO_MODE, TPOT_MODE
from genpool_core.stat_fields import (
    FIELDS,
    REQUIRED_KEYS,
    Kind,
    Over,
    Pool,
    Rule,
    Shown,
    StatField,
    pooled,
)
from genpool_core.statline import (
    MARKER,
    StatLine,
    _parse_values,
    _tokens,
    format_statline,
    parse_statline,
)

ROW_ATTRS = [attr for row in FIELDS if not row.derived for attr in row.attrs]
POOL_META = {"workers_reporting", "windows_counted"}  # counts of lines, not of a field


def test_every_statline_attribute_is_in_exactly_one_row() -> None:
    assert len(ROW_ATTRS) == len(set(ROW_ATTRS)), "an attribute in two rows"
    assert sorted(f.name for f in dataclasses.fields(StatLine)) == sorted(ROW_ATTRS)


def test_derived_rows_are_statline_properties() -> None:
    derived = [row for row in FIELDS if row.derived]
    assert [row.key for row in derived] == ["ttft_p90"]
    for row in derived:
        (attr,) = row.attrs
        assert isinstance(getattr(StatLine, attr), property)


def test_rows_are_well_formed() -> None:
    keys = [row.key for row in FIELDS]
    assert len(keys) == len(set(keys)), "a key in two rows"
    for row in FIELDS:
        assert len(row.attrs) == (2 if row.is_pair else 1), row.key
        assert (row.digits is not None) == (row.kind in (Kind.FLOAT, Kind.FLOAT_PAIR)), row.key
        assert row.pools == () or len(row.pools) == len(row.attrs), row.key
        assert not (row.required and row.shown is not Shown.ALWAYS), row.key
        assert not (row.derived and (row.required or row.pools)), row.key


def test_the_required_keys_are_the_parsers_old_list() -> None:
    assert REQUIRED_KEYS == ("t", "mode", "residents", "active", "paused", "cap", "headroom",
                             "waiters")  # fmt: skip


def test_every_pool_stats_attribute_comes_from_exactly_one_row() -> None:
    attrs = [pool.attr for _, _, pool in pooled()]
    assert len(attrs) == len(set(attrs)), "a PoolStats attribute pooled twice"
    assert set(attrs) | POOL_META == {f.name for f in dataclasses.fields(PoolStats)}
    line_attrs = {f.name for f in dataclasses.fields(StatLine)}
    for row, _, pool in pooled():
        assert (pool.weight is not None) == (pool.rule is Rule.WEIGHTED_MEAN), pool.attr
        if pool.weight is not None:
            assert pool.weight.attr in line_attrs, pool.attr
        if pool.rule is Rule.SUM:
            assert row.kind in (Kind.INT, Kind.INT_PAIR, Kind.VICTIMS, Kind.HISTOGRAM), pool.attr


def test_status_keys_come_from_the_rows_in_the_documented_order() -> None:
    pool = aggregate([parse_statline(_full_text(SLO_MODE))])
    assert pool is not None
    assert list(pool.to_status()) == [
        "paused", "cap", "headroom", "kvUsage", "kvPausedShare", "pauseBudget",
        "belowTargetWindow", "belowTargetTotal", "credit",
        "victims", "victimsText", "meanLaxitySeconds", "laxityResumes", "pausedBelowTarget",
        "waiters", "atRisk", "admissionTargetSeconds",
    ]  # fmt: skip


# -- the generic machinery over every row ---------------------------------------------------


def _full_line(mode: str) -> StatLine:
    """Every attribute set, each to a value of its own that survives the printed digits."""
    hist = [0] * ttft_histogram.NUM_BUCKETS
    hist[3], hist[12] = 4, 6
    return StatLine(
        t=12.5, mode=mode, residents=11, active=9, paused=2, cap=7, headroom=8, waiters=5,
        at_risk=3, target_output_tps=18.5, admission_target_s=0.75, below_target_window=0.125,
        below_target_total=0.25, credit=-1.5, victims={"wait": 1, "laxity": 4},
        mean_laxity=2.25, laxity_resumes=13, forced_resumes=14, paused_below_target=1,
        completed_window=20, completed_total=200, pauses_window=6, pauses_total=60,
        tpot_budget=0.125, window_s=0.375, inflation=0.5, arrivals_window=30,
        arrivals_total=300, steps_window=40, batch_mean=7.5, ttft_hist=tuple(hist),
        slo_completed_window=15, slo_completed_total=150, batch_seconds=92.5, pause_budget=3,
    )  # fmt: skip


def _full_text(mode: str) -> str:
    return format_statline(_full_line(mode))


_SET = {"pause_budget", "slo_completed", "below_target"}  # set on the full line in any mode
_MODE_ROWS = {
    SLO_MODE: {"T", "credit", "mean_laxity", "laxity_resumes", "paused_below_target"} | _SET,
    TPOT_MODE: {"budget", "window", "inflation"} | _SET,
    OFF_MODE: _SET,
}  # fmt: skip


@pytest.mark.parametrize("mode", [SLO_MODE, TPOT_MODE, OFF_MODE])
def test_the_line_prints_the_rows_it_shows_in_row_order(mode: str) -> None:
    keys = [token.partition("=")[0] for token in _full_text(mode)[len(MARKER) :].split()]
    always = [row.key for row in FIELDS if row.shown in (Shown.ALWAYS, Shown.ARRIVALS)]
    assert set(keys) == set(always) | _MODE_ROWS[mode]
    assert keys == [row.key for row in FIELDS if row.key in keys]


@pytest.mark.parametrize("mode", [SLO_MODE, TPOT_MODE, OFF_MODE])
def test_every_shown_row_parses_back_to_its_attributes(mode: str) -> None:
    """What the line shows comes back exactly; what it does not keeps its default."""
    line = _full_line(mode)
    text = format_statline(line)
    shown = [attr for row in FIELDS if f" {row.key}=" in text and not row.derived
             for attr in row.attrs]  # fmt: skip
    blank = StatLine(t=0.0, mode="", residents=0, active=0, paused=0, cap=0, headroom=0,
                     waiters=0)  # fmt: skip
    assert parse_statline(text) == dataclasses.replace(
        blank, **{attr: getattr(line, attr) for attr in shown}
    )


def test_a_required_row_with_a_dash_is_no_line() -> None:
    text = _full_text(SLO_MODE).replace("t=12.5", "t=-")
    assert parse_statline(text) is None


# -- one added row: it shows in format, parse and aggregate -----------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Extended(StatLine):
    retries_window: int = 0
    retries_total: int = 0


_EXTENDED = (
    *FIELDS,
    StatField("retries", ("retries_window", "retries_total"), Kind.INT_PAIR,
              pools=(Pool("retries_window", Rule.SUM, Over.WINDOWS), None)),
)  # fmt: skip


def test_an_added_row_is_formatted_parsed_and_pooled() -> None:
    base = parse_statline(_full_text(OFF_MODE))  # what an off line carries
    assert base is not None
    line = _Extended(**{a: getattr(base, a) for a in ROW_ATTRS}, retries_window=3,
                     retries_total=9)  # fmt: skip
    text = f"{MARKER} " + " ".join(_tokens(line, _EXTENDED))
    assert text == format_statline(base) + " retries=3/9"
    values = _parse_values(text, _EXTENDED)
    assert values is not None
    assert _Extended(**values) == line  # type: ignore[arg-type]
    pool = _pooled_values([line, line], [line, line, line], _EXTENDED)
    assert pool["retries_window"] == 9
    assert pool["completed_window"] == 3 * base.completed_window  # the others as before
