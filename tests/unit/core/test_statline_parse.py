"""The stat-line parser: any order, unknown keys, log tails; never raises on garbage."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genpool_core import ttft_histogram
from genpool_core.statline import (
    MARKER,
    StatLine,
    format_statline,
    parse_statline,
)
from tests.unit.statline_cases import (
    DESIGN_EXAMPLE,
    statlines,
)

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


def test_scaler_fields_round_trip_and_a_bad_histogram_is_garbage() -> None:
    hist = [0] * ttft_histogram.NUM_BUCKETS
    hist[10], hist[20] = 9, 1
    example = parse_statline(DESIGN_EXAMPLE)
    assert example is not None
    line = dataclasses.replace(
        example,
        arrivals_window=12, arrivals_total=340, steps_window=250, batch_mean=13.5,
        ttft_hist=tuple(hist),
    )  # fmt: skip
    text = format_statline(line)
    assert "arrivals=12/340 steps=250 batch=13.50" in text and "ttft_hist=10:9,20:1" in text
    assert parse_statline(text) == line
    assert parse_statline(text.replace("ttft_hist=10:9", "ttft_hist=10:x")) is None
    assert parse_statline(text.replace("ttft_hist=10:9", "ttft_hist=99:9")) is None
