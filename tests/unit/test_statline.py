"""The stat line (DESIGN.md §6): window/total maths, exact text, round trip, robust parser."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genpool_worker.preemption import GenCapacity
from genpool_worker.request import GenRequest
from genpool_worker.scheduler import GenScheduler, SchedulerConfig
from genpool_worker.statline import (
    MARKER,
    StatLine,
    format_statline,
    make_statline,
    parse_statline,
)
from genpool_worker.stats import SchedulerStats

SLO = "target_output_tps"
TPOT = "tpot_budget"
OFF = "off"

# The example line of DESIGN.md §6, verbatim.
DESIGN_EXAMPLE = (
    "gen_preemption stats t=1712.0 mode=target_output_tps T=18.50 residents=40 active=32 "
    "paused=8 cap=12 headroom=12 waiters=5 at_risk=2 X=0.84 below_target=0.115/0.121 "
    "credit=3.40 victims=laxity:40,below_target:10,sacrificed:7 mean_laxity=1.27 "
    "laxity_resumes=38 forced_resumes=17 paused_below_target=1 completed=180/5230 "
    "pauses=57/2110"
)


def slo_snapshots() -> tuple[SchedulerStats, SchedulerStats]:
    """Two cumulative snapshots whose window is exactly DESIGN.md's example line."""
    prev = SchedulerStats(
        t=1682.0,
        mode=SLO,
        target_output_tps=18.5,
        residents=38,
        active=32,
        paused=6,
        paused_cap=12,
        resident_headroom=12,
        waiters=9,
        at_risk=4,
        admission_target_s=0.9,
        completed=5050,
        aborted=3,
        pauses=2053,
        victims={"laxity": 60, "below_target": 20, "sacrificed": 5},
        laxity_sum=70.0,
        laxity_resumes=52,
        forced_resumes=23,
        slo_completed=4800,
        below_target=582,
        mode_fields={"credit": 1.0, "paused_below_target": 3},
    )
    cur = SchedulerStats(
        t=1712.0,
        mode=SLO,
        target_output_tps=18.5,
        residents=40,
        active=32,
        paused=8,
        paused_cap=12,
        resident_headroom=12,
        waiters=5,
        at_risk=2,
        admission_target_s=0.84,
        completed=5230,
        aborted=4,
        pauses=2110,
        # sacrificed first: the line orders kinds laxity, below_target, sacrificed.
        victims={"sacrificed": 12, "laxity": 100, "below_target": 30},
        laxity_sum=120.8,  # window sum 50.8 over 40 laxity victims -> mean 1.27
        laxity_resumes=90,
        forced_resumes=40,
        slo_completed=5000,  # window: 23 below of 200 -> 0.115; total 605/5000 -> 0.121
        below_target=605,
        mode_fields={"credit": 3.4, "paused_below_target": 1},
    )
    return prev, cur


def tpot_snapshots() -> tuple[SchedulerStats, SchedulerStats]:
    prev = SchedulerStats(
        t=30.0,
        mode=TPOT,
        target_output_tps=None,
        residents=70,
        active=64,
        paused=6,
        paused_cap=24,
        resident_headroom=24,
        waiters=100,
        at_risk=10,
        admission_target_s=1.5,
        completed=400,
        pauses=90,
        victims={"wait": 90},
        forced_resumes=80,
        mode_fields={"budget": 0.1, "window": 0.25},
    )
    cur = SchedulerStats(
        t=60.04,
        mode=TPOT,
        target_output_tps=None,
        residents=80,
        active=64,
        paused=16,
        paused_cap=24,
        resident_headroom=24,
        waiters=120,
        at_risk=7,
        admission_target_s=1.2345,
        completed=1000,
        pauses=150,
        victims={"wait": 150},
        forced_resumes=125,
        # tpot mode has no laxity: these must not show up on the line.
        laxity_sum=9.0,
        laxity_resumes=7,
        mode_fields={"budget": 0.1, "window": 0.3536, "inflation": 0.0812},
    )
    return prev, cur


def off_snapshots() -> tuple[SchedulerStats, SchedulerStats]:
    prev = SchedulerStats(
        t=0.0,
        mode=OFF,
        target_output_tps=None,
        residents=0,
        active=0,
        paused=0,
        paused_cap=0,
        resident_headroom=0,
        waiters=0,
        at_risk=0,
        admission_target_s=None,
        completed=0,
    )
    cur = dataclasses.replace(
        prev, t=29.96, residents=16, active=16, waiters=3, admission_target_s=0.256, completed=77
    )
    return prev, cur


# -- make_statline: window = cur - prev, totals = cur ----------------------------------


def test_slo_window_and_total_fields() -> None:
    prev, cur = slo_snapshots()
    line = make_statline(cur, prev)
    assert line.t == 1712.0
    assert line.mode == SLO
    assert line.target_output_tps == 18.5
    assert (line.residents, line.active, line.paused) == (40, 32, 8)
    assert (line.cap, line.headroom, line.waiters, line.at_risk) == (12, 12, 5, 2)
    assert line.admission_target_s == 0.84
    assert line.below_target_window == pytest.approx(23 / 200)
    assert line.below_target_total == pytest.approx(605 / 5000)
    assert line.credit == 3.4
    assert line.victims == {"laxity": 40, "below_target": 10, "sacrificed": 7}
    assert line.mean_laxity == pytest.approx(50.8 / 40)
    assert line.laxity_resumes == 38
    assert line.forced_resumes == 17
    assert line.paused_below_target == 1
    assert (line.completed_window, line.completed_total) == (180, 5230)
    assert (line.pauses_window, line.pauses_total) == (57, 2110)


def test_slo_line_is_the_design_example_exactly() -> None:
    prev, cur = slo_snapshots()
    assert format_statline(make_statline(cur, prev)) == DESIGN_EXAMPLE


def test_tpot_line_exact_text() -> None:
    prev, cur = tpot_snapshots()
    text = format_statline(make_statline(cur, prev))
    assert text == (
        "gen_preemption stats t=60.0 mode=tpot_budget budget=0.100 window=0.354 "
        "inflation=0.081 residents=80 active=64 paused=16 cap=24 headroom=24 waiters=120 "
        "at_risk=7 X=1.23 victims=wait:60 forced_resumes=45 completed=600/1000 pauses=60/150"
    )


def test_tpot_line_without_inflation_yet_prints_dash() -> None:
    prev, cur = tpot_snapshots()
    cur = dataclasses.replace(cur, mode_fields={"budget": 0.1, "window": 0.25})
    text = format_statline(make_statline(cur, prev))
    assert " budget=0.100 window=0.250 inflation=- residents=80 " in text
    parsed = parse_statline(text)
    assert parsed is not None
    assert parsed.inflation is None
    assert parsed.window_s == 0.25


def test_off_line_exact_text() -> None:
    prev, cur = off_snapshots()
    text = format_statline(make_statline(cur, prev))
    assert text == (
        "gen_preemption stats t=30.0 mode=off residents=16 active=16 paused=0 cap=0 "
        "headroom=0 waiters=3 at_risk=0 X=0.26 victims=- forced_resumes=0 "
        "completed=77/77 pauses=0/0"
    )


def test_off_line_before_warmup_has_no_target() -> None:
    _, cur = off_snapshots()
    cur = dataclasses.replace(cur, admission_target_s=None)
    text = format_statline(make_statline(cur, None))
    assert " X=- " in text


def test_first_line_without_prev_uses_totals_as_window() -> None:
    _, cur = slo_snapshots()
    line = make_statline(cur, None)
    assert line.victims == {"laxity": 100, "below_target": 30, "sacrificed": 12}
    assert (line.completed_window, line.completed_total) == (5230, 5230)
    assert (line.pauses_window, line.pauses_total) == (2110, 2110)
    assert line.laxity_resumes == 90
    assert line.forced_resumes == 40
    assert line.below_target_window == pytest.approx(605 / 5000)
    assert line.below_target_total == pytest.approx(605 / 5000)
    assert line.mean_laxity == pytest.approx(120.8 / 100)


def test_quiet_window_has_no_ratios_but_keeps_totals() -> None:
    """No SLO completion and no laxity victim in the window: '-' rather than 0 or a crash."""
    _, cur = slo_snapshots()
    later = dataclasses.replace(cur, t=1742.0)  # nothing happened in 30 s
    line = make_statline(later, cur)
    assert line.below_target_window is None
    assert line.below_target_total == pytest.approx(605 / 5000)
    assert line.mean_laxity is None
    # Kinds with no pause in the window are left out, so a quiet window shows "-".
    assert line.victims == {}
    assert (line.completed_window, line.pauses_window) == (0, 0)
    text = format_statline(line)
    assert " below_target=-/0.121 " in text
    assert " mean_laxity=- " in text
    assert " victims=- " in text
    assert text.endswith(" completed=0/5230 pauses=0/2110")


def test_no_slo_completions_at_all() -> None:
    _, cur = slo_snapshots()
    cur = dataclasses.replace(cur, slo_completed=0, below_target=0)
    line = make_statline(cur, None)
    assert line.below_target_window is None
    assert line.below_target_total is None
    assert " below_target=-/- " in format_statline(line)


def test_mean_laxity_ignores_other_victim_kinds() -> None:
    prev, cur = slo_snapshots()
    # More below_target/sacrificed victims change nothing: the mean is per laxity victim.
    cur = dataclasses.replace(cur, victims={"laxity": 100, "below_target": 80, "sacrificed": 50})
    assert make_statline(cur, prev).mean_laxity == pytest.approx(50.8 / 40)


def test_new_victim_kind_in_window_counts_from_zero() -> None:
    prev, cur = slo_snapshots()
    cur = dataclasses.replace(cur, victims={**cur.victims, "wait": 3})
    line = make_statline(cur, prev)
    assert line.victims["wait"] == 3
    text = format_statline(line)
    assert "victims=laxity:40,below_target:10,sacrificed:7,wait:3 " in text


def test_kind_without_pauses_in_the_window_is_left_out() -> None:
    prev, cur = slo_snapshots()
    cur = dataclasses.replace(cur, victims={**cur.victims, "sacrificed": 5})  # as in prev
    line = make_statline(cur, prev)
    assert line.victims == {"laxity": 40, "below_target": 10}
    assert " victims=laxity:40,below_target:10 mean_laxity=1.27 " in format_statline(line)


def test_unknown_victim_kinds_sort_after_known_ones() -> None:
    line = StatLine(
        t=1.0,
        mode=OFF,
        residents=0,
        active=0,
        paused=0,
        cap=0,
        headroom=0,
        waiters=0,
        victims={"zeta": 1, "wait": 2, "alpha": 3, "laxity": 4},
    )
    assert " victims=laxity:4,wait:2,alpha:3,zeta:1 " in format_statline(line)


def test_make_statline_ignores_non_numeric_mode_fields() -> None:
    _, cur = slo_snapshots()
    cur = dataclasses.replace(cur, mode_fields={"credit": "lots", "paused_below_target": 1.5})
    line = make_statline(cur, None)
    assert line.credit is None
    assert line.paused_below_target is None
    text = format_statline(line)
    assert " credit=- " in text
    assert " paused_below_target=- " in text


# -- round trip ------------------------------------------------------------------------


def test_design_example_parses_to_its_fields() -> None:
    line = parse_statline(DESIGN_EXAMPLE)
    assert line is not None
    assert line.t == 1712.0
    assert line.mode == SLO
    assert line.target_output_tps == 18.5
    assert line.admission_target_s == 0.84
    assert (line.below_target_window, line.below_target_total) == (0.115, 0.121)
    assert line.credit == 3.4
    assert line.victims == {"laxity": 40, "below_target": 10, "sacrificed": 7}
    assert line.mean_laxity == 1.27
    assert (line.laxity_resumes, line.forced_resumes, line.paused_below_target) == (38, 17, 1)
    assert (line.completed_window, line.completed_total) == (180, 5230)
    assert (line.pauses_window, line.pauses_total) == (57, 2110)
    assert format_statline(line) == DESIGN_EXAMPLE


@pytest.mark.parametrize("snapshots", [slo_snapshots, tpot_snapshots, off_snapshots])
def test_format_parse_round_trip_of_made_lines(snapshots: object) -> None:
    prev, cur = snapshots()  # type: ignore[operator]
    line = make_statline(cur, prev)
    parsed = parse_statline(format_statline(line))
    assert parsed == expected_after_round_trip(line)
    assert format_statline(parsed) == format_statline(line)


# Fields printed per mode, with the digits each float is printed with.
_COMMON_FLOATS = {"t": 1, "admission_target_s": 2}
_MODE_FLOATS = {
    SLO: {
        "target_output_tps": 2,
        "below_target_window": 3,
        "below_target_total": 3,
        "credit": 2,
        "mean_laxity": 2,
    },
    TPOT: {"tpot_budget": 3, "window_s": 3, "inflation": 3},
    OFF: {},
}
_SLO_ONLY_OTHERS = {"laxity_resumes": 0, "paused_below_target": None}
_ALL_MODE_FLOATS = {name for digits in _MODE_FLOATS.values() for name in digits}


def expected_after_round_trip(line: StatLine) -> StatLine:
    """What parse(format(line)) must give: floats rounded, other modes' fields unset."""
    changes: dict[str, object] = {}
    printed = {**_COMMON_FLOATS, **_MODE_FLOATS.get(line.mode, {})}
    for name in _ALL_MODE_FLOATS | set(_COMMON_FLOATS):
        value = getattr(line, name)
        if name not in printed:
            changes[name] = None
        elif value is not None:
            changes[name] = round(value, printed[name]) + 0.0  # -0.0 -> 0.0
    if line.mode != SLO:
        changes.update(_SLO_ONLY_OTHERS)
    return dataclasses.replace(line, **changes)  # type: ignore[arg-type]


_counts = st.integers(min_value=0, max_value=10**12)
_finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
_opt_finite = st.none() | _finite
_kind = st.sampled_from(["laxity", "below_target", "sacrificed", "wait"]) | st.from_regex(
    r"\A[a-z][a-z_]{0,11}\Z"
)


@st.composite
def statlines(draw: st.DrawFn) -> StatLine:
    return StatLine(
        t=draw(st.floats(min_value=0.0, max_value=1e9)),
        mode=draw(st.sampled_from([SLO, TPOT, OFF])),
        residents=draw(_counts),
        active=draw(_counts),
        paused=draw(_counts),
        cap=draw(_counts),
        headroom=draw(_counts),
        waiters=draw(_counts),
        at_risk=draw(_counts),
        target_output_tps=draw(_opt_finite),
        admission_target_s=draw(_opt_finite),
        below_target_window=draw(_opt_finite),
        below_target_total=draw(_opt_finite),
        credit=draw(_opt_finite),
        victims=draw(st.dictionaries(_kind, _counts, max_size=6)),
        mean_laxity=draw(_opt_finite),
        laxity_resumes=draw(_counts),
        forced_resumes=draw(_counts),
        paused_below_target=draw(st.none() | _counts),
        completed_window=draw(_counts),
        completed_total=draw(_counts),
        pauses_window=draw(_counts),
        pauses_total=draw(_counts),
        tpot_budget=draw(_opt_finite),
        window_s=draw(_opt_finite),
        inflation=draw(_opt_finite),
    )


@given(statlines())
def test_round_trip_property(line: StatLine) -> None:
    text = format_statline(line)
    assert "\n" not in text
    parsed = parse_statline(text)
    assert parsed == expected_after_round_trip(line)
    # Formatting is a fixed point after one round.
    assert format_statline(parsed) == text


@given(statlines(), st.randoms(use_true_random=False))
def test_round_trip_with_shuffled_tokens(line: StatLine, rnd: random.Random) -> None:
    text = format_statline(line)
    tokens = text[len(MARKER) :].split()
    rnd.shuffle(tokens)
    assert parse_statline(f"{MARKER} {' '.join(tokens)}") == parse_statline(text)


# -- parser tolerance --------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    assert text.startswith(MARKER + " ")
    return text[len(MARKER) + 1 :].split(" ")


def _join(tokens: list[str]) -> str:
    return f"{MARKER} {' '.join(tokens)}"


def test_any_key_order() -> None:
    expected = parse_statline(DESIGN_EXAMPLE)
    assert expected is not None
    tokens = _tokens(DESIGN_EXAMPLE)
    assert parse_statline(_join(list(reversed(tokens)))) == expected
    rnd = random.Random(1234)
    for _ in range(20):
        rnd.shuffle(tokens)
        assert parse_statline(_join(tokens)) == expected


def test_unknown_keys_and_stray_tokens_are_ignored() -> None:
    tokens = _tokens(DESIGN_EXAMPLE)
    noisy = ["rank=0", "future_field=1.5/2", *tokens[:5], "hello", "=orphan", *tokens[5:], "x=y"]
    assert parse_statline(_join(noisy)) == parse_statline(DESIGN_EXAMPLE)


def test_extra_whitespace_between_tokens() -> None:
    spaced = f"{MARKER}\t" + "   ".join(_tokens(DESIGN_EXAMPLE)) + " \t "
    assert parse_statline(spaced) == parse_statline(DESIGN_EXAMPLE)


@pytest.mark.parametrize(
    "prefix",
    [
        "2024-05-01 12:00:00,123 INFO genpool.gen_preemption: ",
        "2024-05-01T12:00:00.123456Z [rank0] genpool.gen_preemption INFO ",
        "[pod/gen-0/worker] ",
    ],
)
def test_line_inside_a_log_record(prefix: str) -> None:
    parsed = parse_statline(prefix + DESIGN_EXAMPLE)
    assert parsed is not None
    assert parsed == parse_statline(DESIGN_EXAMPLE)
    assert parsed.completed_total == 5230


def test_last_stat_line_of_a_log_tail_wins() -> None:
    older = DESIGN_EXAMPLE.replace("t=1712.0", "t=1682.0").replace("completed=180/", "completed=9/")
    tail = "\n".join(
        [
            "2024-05-01 12:00:00 INFO genpool.gen_preemption: " + older,
            "2024-05-01 12:00:10 INFO genpool.engine: step 1200 batch=32",
            "2024-05-01 12:00:30 INFO genpool.gen_preemption: " + DESIGN_EXAMPLE,
            "2024-05-01 12:00:31 WARNING genpool.server: slow client",
            "",
        ]
    )
    parsed = parse_statline(tail)
    assert parsed is not None
    assert parsed.t == 1712.0
    assert parsed.completed_window == 180
    # CRLF endings (kubectl logs on some platforms) change nothing.
    assert parse_statline(tail.replace("\n", "\r\n")) == parsed
    # Only the older line: it is found.
    only_older = parse_statline(tail.split("\n")[0] + "\nnoise\n")
    assert only_older is not None
    assert only_older.t == 1682.0
    assert only_older.completed_window == 9


def test_a_broken_last_line_falls_back_to_the_previous_good_one() -> None:
    truncated = DESIGN_EXAMPLE[: DESIGN_EXAMPLE.index("residents=")]  # lost required keys
    parsed = parse_statline(DESIGN_EXAMPLE + "\n" + truncated)
    assert parsed is not None
    assert parsed.t == 1712.0


def test_bytes_are_decoded() -> None:
    parsed = parse_statline(DESIGN_EXAMPLE.encode())
    assert parsed == parse_statline(DESIGN_EXAMPLE)
    # An undecodable byte elsewhere in a log tail does not hide the stat line.
    tail = b"\xff\xfe binary junk \x80\n" + DESIGN_EXAMPLE.encode() + b"\n"
    assert parse_statline(tail) == parse_statline(DESIGN_EXAMPLE)


def test_dash_values_parse_as_missing() -> None:
    parsed = parse_statline(
        f"{MARKER} t=5.0 mode=target_output_tps T=- residents=1 active=1 paused=0 cap=0 "
        "headroom=0 waiters=0 X=- below_target=-/- credit=- victims=- mean_laxity=- "
        "paused_below_target=-"
    )
    assert parsed is not None
    assert parsed.target_output_tps is None
    assert parsed.admission_target_s is None
    assert parsed.below_target_window is None
    assert parsed.below_target_total is None
    assert parsed.credit is None
    assert parsed.victims == {}
    assert parsed.mean_laxity is None
    assert parsed.paused_below_target is None
    # Optional counters that are absent take their defaults.
    assert (parsed.completed_window, parsed.completed_total) == (0, 0)
    assert (parsed.pauses_window, parsed.pauses_total, parsed.at_risk) == (0, 0, 0)


def test_negative_credit_and_laxity_are_legal() -> None:
    text = DESIGN_EXAMPLE.replace("credit=3.40", "credit=-2.60").replace(
        "mean_laxity=1.27", "mean_laxity=-0.50"
    )
    parsed = parse_statline(text)
    assert parsed is not None
    assert parsed.credit == -2.6
    assert parsed.mean_laxity == -0.5


def _replace_token(key: str, value: str) -> str:
    tokens = _tokens(DESIGN_EXAMPLE)
    found = [i for i, tok in enumerate(tokens) if tok.startswith(key + "=")]
    assert len(found) == 1, key
    tokens[found[0]] = f"{key}={value}"
    return _join(tokens)


_REQUIRED_KEYS = ["t", "mode", "residents", "active", "paused", "cap", "headroom", "waiters"]


@pytest.mark.parametrize("key", _REQUIRED_KEYS)
def test_missing_required_key_is_no_line(key: str) -> None:
    tokens = [tok for tok in _tokens(DESIGN_EXAMPLE) if not tok.startswith(key + "=")]
    assert len(tokens) == len(_tokens(DESIGN_EXAMPLE)) - 1
    assert parse_statline(_join(tokens)) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        # negative counts
        ("residents", "-1"),
        ("waiters", "-7"),
        ("at_risk", "-1"),
        ("forced_resumes", "-3"),
        ("paused_below_target", "-1"),
        ("completed", "-1/5230"),
        ("pauses", "57/-2110"),
        ("victims", "laxity:-40"),
        # not finite
        ("t", "nan"),
        ("t", "inf"),
        ("X", "NaN"),
        ("T", "-inf"),
        ("credit", "inf"),
        ("mean_laxity", "nan"),
        ("below_target", "nan/0.121"),
        ("below_target", "0.115/infinity"),
        # not numbers / wrong shapes
        ("t", "-"),
        ("t", "abc"),
        ("residents", "4.5"),
        ("residents", ""),
        ("completed", "abc"),
        ("completed", "180"),
        ("completed", "180/"),
        ("completed", "a/b"),
        ("pauses", "57/2110/3"),
        ("below_target", "0.115"),
        ("victims", "laxity"),
        ("victims", "laxity:"),
        ("victims", ":40"),
        ("victims", "laxity:40,"),
        ("victims", "laxity:x"),
        ("credit", "3,40"),
        ("X", "0.84s"),
    ],
)
def test_bad_value_is_no_line(key: str, value: str) -> None:
    assert parse_statline(_replace_token(key, value)) is None


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        None,
        42,
        3.5,
        ["gen_preemption stats"],
        {"t": 1.0},
        b"",
        b"\xff\xfe\xfa\x80\x81",
        b"\xc3\x28 gen_preemption stats \xa0\xa1",
        "hello world",
        "gen_preemption",
        "gen_preemption stats",
        "gen_preemption stats t=1.0 mode=off",
        "gen_preemption stats t= mode= residents= active= paused= cap= headroom= waiters=",
        "t=1.0 mode=off residents=1 active=1 paused=0 cap=0 headroom=0 waiters=0",
        "\n\n\n",
        "\x00" * 100,
        "gen_preemption stats " + "=" * 1000,
        "gen_preemption stats residents=" + "9" * 5000,
    ],
)
def test_garbage_is_no_line(garbage: object) -> None:
    assert parse_statline(garbage) is None


def test_huge_number_is_no_line_not_a_crash() -> None:
    assert parse_statline(_replace_token("completed", "1/" + "9" * 5000)) is None
    assert parse_statline(_replace_token("t", "1e999")) is None


# -- never raises -------------------------------------------------------------------------

_KEYS = [
    "t",
    "mode",
    "T",
    "X",
    "residents",
    "active",
    "paused",
    "cap",
    "headroom",
    "waiters",
    "at_risk",
    "below_target",
    "credit",
    "victims",
    "mean_laxity",
    "laxity_resumes",
    "forced_resumes",
    "paused_below_target",
    "completed",
    "pauses",
    "budget",
    "window",
    "inflation",
    "unknown",
]
_value_text = st.text(alphabet="0123456789-+./:,_eEnaifxNI=\u00e9", max_size=12)
_token_soup = st.lists(
    st.tuples(st.sampled_from(_KEYS), _value_text).map(lambda kv: f"{kv[0]}={kv[1]}"),
    max_size=30,
).map(lambda toks: f"{MARKER} {' '.join(toks)}")

_INT_FIELDS = [f.name for f in dataclasses.fields(StatLine) if f.type in ("int", "int | None")]
_FLOAT_FIELDS = [f.name for f in dataclasses.fields(StatLine) if "float" in str(f.type)]


def _check_sane(result: StatLine | None) -> None:
    """A parsed line never carries a negative count or a non-finite number."""
    if result is None:
        return
    assert isinstance(result, StatLine)
    for name in _INT_FIELDS:
        value = getattr(result, name)
        assert value is None or value >= 0, name
    for name in _FLOAT_FIELDS:
        value = getattr(result, name)
        assert value is None or math.isfinite(value), name
    assert all(count >= 0 for count in result.victims.values())


def test_field_lists_cover_the_statline() -> None:
    assert {"residents", "paused_below_target", "pauses_total"} <= set(_INT_FIELDS)
    assert {"t", "credit", "inflation", "below_target_window"} <= set(_FLOAT_FIELDS)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(),
        st.binary(),
        st.text().map(lambda s: MARKER + " " + s),
        st.binary().map(lambda b: MARKER.encode() + b" " + b),
        _token_soup,
        st.lists(_token_soup | st.text(), max_size=5).map("\n".join),
    )
)
def test_parser_never_raises(data: str | bytes) -> None:
    _check_sane(parse_statline(data))


@settings(max_examples=200)
@given(statlines(), st.integers(min_value=0, max_value=40), st.text(max_size=3))
def test_damaged_lines_never_raise(line: StatLine, cut: int, junk: str) -> None:
    text = format_statline(line)
    position = min(len(text), len(MARKER) + 1 + cut * 7)
    _check_sane(parse_statline(text[:position] + junk + text[position:]))
    _check_sane(parse_statline(text[:position]))


# -- the scheduler's own lines ------------------------------------------------------------


def test_scheduler_stat_lines_parse_and_chain_windows() -> None:
    """Lines emitted by GenScheduler parse, and their windows add up to the totals."""
    scheduler = GenScheduler.from_settings(
        {"target_output_tps": 20.0},
        GenCapacity(max_batch_size=4),
        SchedulerConfig(stat_interval_s=1.0),
    )
    rnd = random.Random(7)
    now = 0.0
    serial = 0
    parsed: list[StatLine] = []
    for _ in range(400):
        while scheduler.num_waiting < 6:
            serial += 1
            request = GenRequest(
                f"r{serial}",
                prompt_len=8,
                max_tokens=rnd.randint(2, 30),
                arrival_time=now,
                first_token_time=now,
            )
            scheduler.add_request(request, now)
        plan = scheduler.step(now)
        if plan.stat_line is not None:
            line = parse_statline(plan.stat_line)
            assert line is not None, plan.stat_line
            stats = scheduler.make_stats(now)
            assert line.completed_total == stats.completed
            assert line.pauses_total == stats.pauses
            assert line.residents == scheduler.num_residents
            assert line.waiters == scheduler.num_waiting
            parsed.append(line)
        scheduler.postprocess(plan, now + 0.05)
        now += 0.05
    assert len(parsed) >= 15
    assert all(line.mode == SLO and line.target_output_tps == 20.0 for line in parsed)
    assert parsed[-1].completed_total > 0
    assert sum(line.completed_window for line in parsed) == parsed[-1].completed_total
    assert sum(line.pauses_window for line in parsed) == parsed[-1].pauses_total
    assert [line.t for line in parsed] == sorted(line.t for line in parsed)
