"""Simulator workloads: trace parsing and validation, time scaling, Gamma arrivals,
the closed-loop length sampler (docs/design.md#workloads).

Needs ../shared/data/azure_conv_2023.csv (see shared/data/README.md).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from typing import Any

import pytest

from genpool_sim.datafiles import AZURE_CONV as AZURE_CONV_NAME
from genpool_sim.datafiles import data_file
from genpool_sim.workload import (
    LengthSampler,
    TraceError,
    TraceRequest,
    gamma_arrivals,
    parse_csv_trace,
    parse_jsonl_trace,
    scale_time,
)

AZURE_CONV = data_file(AZURE_CONV_NAME)
HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens"
SMALL = [TraceRequest(0.0, 100, 10), TraceRequest(1.0, 200, 20), TraceRequest(2.5, 300, 30)]


def azure_lines() -> list[str]:
    if not AZURE_CONV.is_file():
        pytest.fail(f"missing data file {AZURE_CONV} (see shared/data/README.md)")
    return AZURE_CONV.read_text().splitlines()


def gap_stats(trace: list[TraceRequest]) -> tuple[float, float]:
    """(rate, CV) of the inter-arrival gaps, the first gap measured from 0."""
    times = [0.0] + [r.arrival_s for r in trace]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean = statistics.fmean(gaps)
    return 1.0 / mean, statistics.pstdev(gaps) / mean


# --- CSV -------------------------------------------------------------------------


def test_parses_the_real_azure_conv_trace() -> None:
    trace = parse_csv_trace(azure_lines(), source="azure_conv_2023.csv")
    assert len(trace) == 19_366
    assert trace[0] == TraceRequest(0.0, 374, 44)
    assert trace[-1] == TraceRequest(3501.721937, 197, 183)
    prompts = [r.prompt_tokens for r in trace]
    outputs = [r.output_tokens for r in trace]
    # The figures of shared/data/README.md.
    assert statistics.fmean(prompts) == pytest.approx(1154.70, abs=0.01)
    assert statistics.median(prompts) == 1020
    assert statistics.fmean(outputs) == pytest.approx(211.13, abs=0.01)
    assert statistics.median(outputs) == 129
    assert min(prompts) == 2 and min(outputs) == 7 and max(outputs) == 1000
    rate, cv = gap_stats(trace[1:])  # gaps between requests, the first one at 0
    assert rate == pytest.approx(5.53, abs=0.01)
    assert cv == pytest.approx(1.094, abs=0.01)


def test_csv_columns_in_any_order_and_extra_columns_ignored() -> None:
    lines = [
        "num_decode_tokens,note,arrived_at,num_prefill_tokens",
        "7,a,0.5,100",
        "",  # blank lines are skipped
        " 8 ,b, 1.25 ,200.0",  # spaces and an integral float count are fine
    ]
    assert parse_csv_trace(lines) == [TraceRequest(0.5, 100, 7), TraceRequest(1.25, 200, 8)]


def test_csv_equal_arrival_times_are_allowed() -> None:
    trace = parse_csv_trace([HEADER, "1.0,5,5", "1.0,6,6"])
    assert [r.arrival_s for r in trace] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("rows", "line", "words"),
    [
        (["arrived_at,num_prefill_tokens", "0,1,1"], 1, "num_decode_tokens"),
        ([HEADER, "0,10,5", "abc,10,5"], 3, "not a number"),
        ([HEADER, "0,ten,5"], 2, "num_prefill_tokens"),
        ([HEADER, "0,10,5.5"], 2, "not an integer"),
        ([HEADER, "0,10,5", "1,10,5", "2,10,0"], 4, "output length 0"),
        ([HEADER, "0,0,5"], 2, "prompt length 0"),
        ([HEADER, "0,-3,5"], 2, "prompt length -3"),
        ([HEADER, "-1,10,5"], 2, "finite value >= 0"),
        ([HEADER, "0,10,5", "nan,10,5"], 3, "finite value >= 0"),
        ([HEADER, "inf,10,5"], 2, "finite value >= 0"),
        ([HEADER, "0,10,5", "2,10,5", "1,10,5"], 4, "before the previous"),
        ([HEADER, "0,10"], 2, "field(s)"),
        ([HEADER], 1, "no requests"),
        ([], 1, "empty trace"),
        ([HEADER, "0,1,1", "", "x,1,1"], 4, "not a number"),  # blank lines still count
    ],
)
def test_invalid_csv_traces_name_the_line(rows: list[str], line: int, words: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_csv_trace(rows, source="bad.csv")
    message = str(caught.value)
    assert message.startswith(f"bad.csv:{line}: ")
    assert words in message
    assert caught.value.line == line and caught.value.source == "bad.csv"
    assert isinstance(caught.value, ValueError)


# --- JSONL -----------------------------------------------------------------------


def test_jsonl_converts_milliseconds_to_seconds() -> None:
    lines = [
        '{"timestamp": 0, "input_length": 100, "output_length": 10}',
        "",
        '{"timestamp": 1500, "input_length": 200, "output_length": 20, "model": "x"}\n',
        '{"output_length": 30.0, "input_length": 300, "timestamp": 2500.5}',
    ]
    assert parse_jsonl_trace(lines) == [
        TraceRequest(0.0, 100, 10),
        TraceRequest(1.5, 200, 20),
        TraceRequest(2.5005, 300, 30),
    ]


def test_jsonl_and_csv_of_the_same_requests_agree() -> None:
    csv_trace = parse_csv_trace([HEADER, "0.25,11,3", "2,12,4"])
    jsonl = [
        '{"timestamp": 250, "input_length": 11, "output_length": 3}',
        '{"timestamp": 2000, "input_length": 12, "output_length": 4}',
    ]
    assert parse_jsonl_trace(jsonl) == csv_trace


def _record(ts: object = 0, inp: object = 10, out: object = 5) -> str:
    return f'{{"timestamp": {ts}, "input_length": {inp}, "output_length": {out}}}'


@pytest.mark.parametrize(
    ("rows", "line", "words"),
    [
        ([_record(), "{not json"], 2, "bad JSON"),
        ([_record(), "[1, 2, 3]"], 2, "JSON object"),
        ([_record(), '{"timestamp": 5, "input_length": 3}'], 2, "output_length"),
        ([_record(inp="true")], 1, "not a number"),
        ([_record(inp='"12"')], 1, "not a number"),
        ([_record(out=2.5)], 1, "not an integer"),
        ([_record(out=0)], 1, "output length 0"),
        ([_record(inp=0)], 1, "prompt length 0"),
        ([_record(ts=-5)], 1, "finite value >= 0"),
        ([_record(ts="NaN")], 1, "finite value >= 0"),
        ([_record(ts=2000), "", _record(ts=1000)], 3, "before the previous"),
        (["", "  "], 2, "no requests"),
        ([], 1, "no requests"),
    ],
)
def test_invalid_jsonl_traces_name_the_line(rows: list[str], line: int, words: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_jsonl_trace(rows, source="bad.jsonl")
    assert str(caught.value).startswith(f"bad.jsonl:{line}: ")
    assert words in str(caught.value)
    assert caught.value.line == line


# --- time scaling ----------------------------------------------------------------


def test_scale_time_multiplies_arrivals_and_keeps_lengths() -> None:
    scaled = scale_time(SMALL, 0.5)
    assert scaled == [
        TraceRequest(0.0, 100, 10),
        TraceRequest(0.5, 200, 20),
        TraceRequest(1.25, 300, 30),
    ]
    assert SMALL[1].arrival_s == 1.0  # the input is not modified
    assert [r.arrival_s for r in scale_time(SMALL, 2.0)] == [0.0, 2.0, 5.0]


@pytest.mark.parametrize("factor", [0.0, -1.0, math.nan, math.inf])
def test_scale_time_rejects_bad_factors(factor: float) -> None:
    with pytest.raises(ValueError, match="factor"):
        scale_time(SMALL, factor)


# --- Gamma arrivals --------------------------------------------------------------


@pytest.mark.parametrize(("rate", "cv"), [(5.5, 1.1), (2.0, 0.5), (20.0, 1.0), (5.5, 2.5)])
def test_gamma_arrivals_match_requested_rate_and_cv(rate: float, cv: float) -> None:
    trace = gamma_arrivals(rate, cv, SMALL, random.Random(7), n=100_000)
    assert len(trace) == 100_000
    got_rate, got_cv = gap_stats(trace)
    # Standard errors at n = 1e5 are below 1% of either; 3% is several of them.
    assert got_rate == pytest.approx(rate, rel=0.03)
    assert got_cv == pytest.approx(cv, rel=0.03)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(trace))


def test_gamma_arrivals_draw_lengths_from_the_trace_pairs() -> None:
    trace = gamma_arrivals(1.0, 1.0, SMALL, random.Random(3), n=300)
    pairs = {(r.prompt_tokens, r.output_tokens) for r in trace}
    assert pairs == {(100, 10), (200, 20), (300, 30)}  # all drawn, and never mixed


def test_gamma_arrivals_by_duration() -> None:
    trace = gamma_arrivals(10.0, 1.0, SMALL, random.Random(11), duration_s=1000.0)
    assert trace[-1].arrival_s <= 1000.0
    assert len(trace) == pytest.approx(10_000, rel=0.05)
    longer = gamma_arrivals(10.0, 1.0, SMALL, random.Random(11), duration_s=2000.0)
    assert longer[: len(trace)] == trace  # same seed, same prefix
    assert len(longer) > len(trace)


def test_gamma_arrivals_are_deterministic_per_seed() -> None:
    first = gamma_arrivals(5.0, 1.5, SMALL, random.Random(42), n=1000)
    assert gamma_arrivals(5.0, 1.5, SMALL, random.Random(42), n=1000) == first
    assert gamma_arrivals(5.0, 1.5, SMALL, random.Random(43), n=1000) != first


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": math.inf}, "rate"),
        ({"cv": 0.0}, "CV"),
        ({"cv": -1.0}, "CV"),
        ({"n": None}, "exactly one"),
        ({"duration_s": 5.0}, "exactly one"),
        ({"n": -1}, "n must be"),
        ({"n": None, "duration_s": 0.0}, "duration_s"),
        ({"trace": []}, "empty trace"),
    ],
)
def test_gamma_arrivals_validate_arguments(kwargs: dict[str, Any], words: str) -> None:
    args: dict[str, Any] = {"rate": 1.0, "cv": 1.0, "trace": SMALL, "n": 10, **kwargs}
    with pytest.raises(ValueError, match=words):
        gamma_arrivals(rng=random.Random(0), **args)


def test_zero_requests_is_an_empty_workload() -> None:
    assert gamma_arrivals(1.0, 1.0, SMALL, random.Random(0), n=0) == []


# --- closed-loop length sampler --------------------------------------------------


def test_length_sampler_draws_whole_pairs_uniformly_over_requests() -> None:
    # (100, 10) is two requests of three: it must come up about twice as often.
    trace = [TraceRequest(0.0, 100, 10), TraceRequest(1.0, 100, 10), TraceRequest(2.0, 7, 900)]
    sampler = LengthSampler(trace, random.Random(5))
    assert len(sampler) == 3
    draws = [sampler.sample() for _ in range(30_000)]
    assert set(draws) == {(100, 10), (7, 900)}
    assert draws.count((100, 10)) / len(draws) == pytest.approx(2 / 3, abs=0.015)


def test_length_sampler_is_deterministic_per_seed() -> None:
    trace = parse_csv_trace(azure_lines())
    a = LengthSampler(trace, random.Random(9))
    b = LengthSampler(trace, random.Random(9))
    c = LengthSampler(trace, random.Random(10))
    first = [a.sample() for _ in range(50)]
    assert first == [b.sample() for _ in range(50)]
    assert first != [c.sample() for _ in range(50)]


def test_length_sampler_rejects_an_empty_trace() -> None:
    with pytest.raises(ValueError, match="empty trace"):
        LengthSampler([], random.Random(0))
