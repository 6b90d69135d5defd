"""The serving benches' arithmetic (bench/pd_report.py, used by bench.pd and
bench.chunked_prefill), on hand-made streams and scrapes."""

from __future__ import annotations

import pytest

from bench.pd_report import Stream, mean_between, medians, paired, summarize, value_at

EDGES = {"t0": 0.0, "tb": 10.0, "te": 20.0, "t1": 30.0}


def test_a_gap_that_overlaps_the_burst_is_a_burst_gap() -> None:
    # one steady stream: a token a second, stalls of 6 s and 9 s overlapping the burst [10, 20]
    steady = Stream("steady", sent=0.5, chunks=[1.0, 2.0, 3.0, 5.0, 11.0, 12.0, 21.0, 22.0],
                    tokens=8)  # fmt: skip
    long = Stream("long", sent=10.0, chunks=[14.0], tokens=1)
    result = summarize([steady, long], EDGES)
    assert result["gap_ms_burst"]["n"] == 3  # 5 -> 11, 11 -> 12, 12 -> 21
    assert result["gap_ms_burst"]["max"] == 9000.0
    # 1, 1, 2, 1 s: p99 interpolated between the two largest (1 + 0.97 s)
    assert result["gap_ms_outside"] == {"n": 4, "p50": 1000.0, "p99": 1970.0, "max": 2000.0}
    assert result["gap_ms_quiet"]["n"] == 3  # 1 -> 2, 2 -> 3, 3 -> 5 end before tb
    assert result["long_ttft_s"]["p50"] == 4.0
    assert result["burst_window_s"] == 10.0
    assert result["failed"] == 0


def test_failed_streams_are_counted_with_their_errors() -> None:
    good = Stream("steady", 1.0, [2.0, 3.0], tokens=2)
    bad = Stream("long", 11.0, [], error="APIError: 503")
    result = summarize([good, bad], EDGES)
    assert result["failed"] == 1
    assert result["errors"] == ["APIError: 503"]
    assert result["long_ttft_s"] == {"n": 0}


def test_mean_between_reads_a_histograms_delta_and_none_without_observations() -> None:
    before = {"genpool_step_seconds_count": 10.0, "genpool_step_seconds_sum": 1.0}
    after = {"genpool_step_seconds_count": 30.0, "genpool_step_seconds_sum": 3.0}
    assert mean_between(before, after, "genpool_step_seconds", 1e3) == pytest.approx(100.0)
    assert mean_between(after, after, "genpool_step_seconds") is None


def _run(setup: str, rep: int, p99: float) -> dict[str, object]:
    return {"setup": setup, "rep": rep, "gap_ms_burst": {"p99": p99}}


def test_medians_and_paired_ratios_over_named_setups() -> None:
    runs = [_run("whole", 0, 1000.0), _run("chunk", 0, 100.0), _run("whole", 1, 2000.0),
            _run("chunk", 1, 500.0), _run("whole", 2, 4000.0)]  # fmt: skip
    table = medians(runs, ("whole", "chunk"), ("gap_ms_burst.p99",))
    assert table["whole"]["gap_ms_burst.p99"] == {"median": 2000.0,
                                                  "runs": [1000.0, 2000.0, 4000.0]}  # fmt: skip
    ratio = paired(runs, "gap_ms_burst.p99", setup="chunk", baseline="whole")
    assert ratio["per_rep"] == [0.1, 0.25]  # rep 2 has no chunk run: not paired
    assert ratio["median"] == pytest.approx(0.175)


def test_value_at_follows_dotted_keys_and_ignores_what_is_not_a_number() -> None:
    run = {"a": {"b": 2.5, "c": "x"}}
    assert value_at(run, "a.b") == 2.5
    assert value_at(run, "a.c") is None
    assert value_at(run, "a.b.d") is None
